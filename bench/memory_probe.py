"""A Hydra callback that measures the launcher process's memory over a multirun, for
``bench/launcher_memory.py``.

Hydra calls ``on_multirun_start`` and ``on_multirun_end`` in the process that runs the sweeper
and the launcher, around ``sweeper.sweep``; at the end the sweeper's return value is still
held, so whatever a sweep keeps per job is counted. The probe samples ``VmRSS`` from
``/proc/self/status`` on a thread while the sweep runs, and writes a JSON report to ``out``.
With ``trace=true`` it also says what holds the memory: live objects by type (``gc``) and the
lines that allocated what is still allocated at the end (``tracemalloc``), both as growth over
the start. Tracing slows the launcher several times over: use it to find, not to time.
"""

from __future__ import annotations

import collections
import gc
import json
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil
from hydra.experimental.callback import Callback

__all__ = ["MemoryProbe", "status_kib"]

# The sampler thread and what it saw; module-level, because Hydra pickles its callbacks into
# the context it sends to the jobs, and a thread does not pickle.
_samples: list[tuple[float, int]] = []
_stop = threading.Event()
_types_at_start: collections.Counter[str] = collections.Counter()


def status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``: resident now, ``VmHWM``: peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _live_types() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
    )


class MemoryProbe(Callback):
    def __init__(self, out: str, trace: bool = False, interval_s: float = 0.25) -> None:
        self.out = out
        self.trace = trace
        self.interval_s = interval_s

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        began = time.monotonic()
        self._began_wall = time.time()
        _samples.append((0.0, status_kib("VmRSS")))
        if self.trace:
            _types_at_start.update(_live_types())
            tracemalloc.start(12)

        def sample() -> None:
            while not _stop.wait(self.interval_s):
                _samples.append((time.monotonic() - began, status_kib("VmRSS")))

        self._began = began
        threading.Thread(target=sample, name="memory-probe", daemon=True).start()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        _stop.set()
        sweep_s = time.monotonic() - self._began
        gc.collect()
        report: dict[str, Any] = {
            "sweep_s": round(sweep_s, 3),
            # wall clock, to line the samples up with the jobs' own times (run_data.csv)
            "began_wall": self._began_wall,
            "ended_wall": time.time(),
            "rss_start_kib": _samples[0][1],
            "rss_end_kib": status_kib("VmRSS"),
            "rss_peak_kib": status_kib("VmHWM"),
            # the fork server, for comparison: it forks every job and must not grow either
            "children_rss_kib": [c.memory_info().rss // 1024 for c in psutil.Process().children()],
            "samples": [(round(t, 2), kib) for t, kib in _samples],
        }
        if self.trace:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            tracemalloc.stop()
            report["traced_kib"] = sum(s.size for s in snapshot.statistics("filename")) // 1024
            report["by_line"] = [
                {"kib": s.size // 1024, "count": s.count, "at": str(s.traceback[0])}
                for s in snapshot.statistics("lineno")[:25]
            ]
            report["by_traceback"] = [
                {
                    "kib": s.size // 1024,
                    "count": s.count,
                    "traceback": [str(frame) for frame in s.traceback],
                }
                for s in snapshot.statistics("traceback")[:12]
            ]
            growth = _live_types()
            growth.subtract(_types_at_start)
            report["object_growth"] = growth.most_common(30)
        Path(self.out).write_text(json.dumps(report, indent=1))
