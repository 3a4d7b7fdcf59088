"""What the benchmarks share: a launcher built the way Hydra builds it, timing and statistics,
how busy the machine was (others' CPU share, load averages), results.

``make_launcher`` does what ``python app.py -m ...`` does up to the sweeper (compose the config,
instantiate ``hydra/launcher``), so the benchmarks drive the real launcher in this process and
can time each call, as ``tests/conftest.py`` does for the tests. Beside it: ``bench/commands.py``
runs an app's Hydra CLI (or any command) in a subprocess, timed; ``bench/timeline.py`` reads a
sweep's jobs on a timeline (slot gaps, makespan, the schedules it is set against).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from hydra import version
from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, RunMode, TaskFunction

from furcate_hydra.execution.local_pool import LocalPool
from furcate_hydra.launching.launch_session import LaunchSession
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

__all__ = [
    "RESULTS_DIR",
    "OthersCpu",
    "as_furcate",
    "local_pool",
    "machine",
    "make_launcher",
    "publish",
    "speed_probe",
    "summarize",
    "task_value",
    "timed",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def make_launcher(
    task_function: TaskFunction, overrides: Sequence[str], sweep_dir: Path
) -> Launcher:
    """Compose an empty app's multirun config with ``overrides`` and instantiate its launcher."""
    # What @hydra.main(version_base="1.3") sets; it travels to the fork server with the
    # singletons, so jobs see the same defaults (no chdir) as in a real app.
    version.setbase("1.3")
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(
        task_name="bench", config_search_path=create_config_search_path(None)
    )
    config = hydra.compose_config(
        None,
        [f"hydra.sweep.dir={sweep_dir}", *overrides],
        run_mode=RunMode.MULTIRUN,
        with_log_configuration=False,
    )
    HydraConfig.instance().set_config(config)
    context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
    return Plugins.instance().instantiate_launcher(
        hydra_context=context, task_function=task_function, config=config
    )


def as_furcate(launcher: Launcher) -> FurcateLauncher:
    # Hydra's plugin scan executes plugin modules a second time, so the launcher's class need
    # not be the FurcateLauncher imported here: compare names, not classes.
    name = f"{type(launcher).__module__}.{type(launcher).__qualname__}"
    if name != f"{FurcateLauncher.__module__}.{FurcateLauncher.__qualname__}":
        raise TypeError(f"expected the furcate launcher, got {name}")
    return cast(FurcateLauncher, launcher)


def local_pool(session: LaunchSession) -> LocalPool:
    """The session's executor, which the benchmarks measure as the local fork-server pool."""
    if not isinstance(session.executor, LocalPool):
        raise TypeError(f"expected the local pool, got {type(session.executor).__name__}")
    return session.executor


def task_value(job_return: JobReturn) -> Any:
    """The task function's return value; a failed job stops the benchmark with its error."""
    if job_return.status is not JobStatus.COMPLETED:
        raise RuntimeError(f"a benchmark job failed: {job_return._return_value!r}")
    return job_return.return_value


def summarize(seconds: Sequence[float]) -> dict[str, float | int]:
    """Median, p90 (inclusive interpolation), min and max of a sample, in milliseconds."""
    ms = [s * 1000.0 for s in seconds]
    p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(p90, 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def timed(call: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    """Wall seconds of ``repeats`` calls of ``call``, and its last value."""
    seconds, value = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        value = call()
        seconds.append(time.perf_counter() - began)
    return seconds, value


def machine_busy_seconds() -> float:
    """CPU time all processes on the machine have used since boot (``/proc/stat``)."""
    ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


class OthersCpu:
    """The share of the machine's CPU that other processes (other people's work) used between
    construction and ``share(own_cpu_s)``; ``own_cpu_s`` is what the benchmark itself used."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.busy = machine_busy_seconds()

    def share(self, own_cpu_s: float) -> float:
        wall = time.perf_counter() - self.began
        others = machine_busy_seconds() - self.busy - own_cpu_s
        return round(max(0.0, others) / (wall * (os.cpu_count() or 1)), 3)


def speed_probe() -> dict[str, float]:
    """How fast this machine is right now, best of 5 runs of fixed work (lower is faster):
    ``loop_ms`` a pure-Python loop (~10 ms: a core's speed), ``files_ms`` 100 small files
    created in their own directories and deleted (~35 ms: the kernel's file-system path, which
    the recorded jobs lean on). On the VM of BENCHMARKS.md ``files_ms`` varied 5x from minute to
    minute, in kernel CPU time, with no other work running: load averages and CPU shares do not
    show that (see "Reading the figures" there)."""

    def loop() -> None:
        total = 0
        for i in range(200_000):
            total += i * i % 7

    def files() -> None:
        with tempfile.TemporaryDirectory(prefix="furcate-probe-") as tmp:
            for i in range(100):
                directory = Path(tmp) / str(i)
                directory.mkdir()
                (directory / "f").write_text("x" * 400)

    return {
        name: round(min(timed(work, 5)[0]) * 1000, 2)
        for name, work in [
            ("loop_ms", loop),
            ("files_ms", files),
        ]
    }


def machine() -> dict[str, Any]:
    """Where and when the figures were taken, and how busy the machine was."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "versions": {
            name: metadata.version(name)
            for name in ("hydra-core", "torch", "pytorch-lightning", "furcate-hydra")
        },
        # Other work on the machine (e.g. a test run) shows here and perturbs the figures.
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "speed_probe_at_start": speed_probe(),
    }


def publish(
    name: str,
    at_start: dict[str, Any],
    figures: dict[str, Any],
    show: Callable[[dict[str, Any]], None],
) -> None:
    """Print ``figures`` with ``show``; write them and ``machine()`` as taken at the start."""
    show(figures)
    path = write_results(name, {"machine": at_start, name: figures})
    print(f"\nwrote {path}")


def write_results(name: str, results: dict[str, Any]) -> Path:
    """Write ``results`` (plus the load average at the end) to ``bench/results/<name>.json``."""
    results["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path
