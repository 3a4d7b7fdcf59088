"""Where a job's Python memory grows, epoch by epoch: tracemalloc's top-N diff (furcate's option).

    train start ──► tracemalloc.start() and a first snapshot
    each training epoch's end ──► snapshot ──► compare_to(the last one) ──► the N lines whose
                                  allocations grew most, appended to tracemalloc.txt

Off by default (``fit(tracemalloc_top=N)``): tracing every allocation slows Python code down
several times. It sees what Python allocates, not what torch allocates in C++ or on a GPU; the
launcher's resource trace (trace.csv) shows those.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.lightning._namespace import CallbackBase

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["TracemallocDiff", "check_top"]

_MIB = 1024 * 1024
# tracemalloc's and the import system's own allocations say nothing about the job
_NOT_THE_JOB = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
)


def check_top(top: object) -> int:
    """``fit``'s ``tracemalloc_top`` as a count; 0 is off."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise FurcateConfigError(
            "fit(tracemalloc_top)",
            top,
            "must be a whole number of lines, 0 (off) or more",
            "pass e.g. tracemalloc_top=10, or 0 to trace nothing",
        )
    return top


class TracemallocDiff(CallbackBase):
    """Appends each training epoch's top ``top`` allocation growths to ``path`` (rank zero)."""

    def __init__(self, path: Path, top: int) -> None:
        self.path = path
        self.top = top
        self._last: tracemalloc.Snapshot | None = None
        self._started = False  # by us: stopped by us too

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started = True
        self._last = _snapshot()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last is None:
            return
        snapshot = _snapshot()
        # compare_to orders by how much a line changed, shrinking or growing: growth is wanted
        diffs = snapshot.compare_to(self._last, "lineno")
        grown = [diff for diff in diffs if diff.size_diff > 0][: self.top]
        self._last = snapshot
        current, peak = tracemalloc.get_traced_memory()
        lines = [
            f"epoch {trainer.current_epoch}: Python memory traced {current / _MIB:.1f} MiB "
            f"(peak {peak / _MIB:.1f} MiB); the {len(grown)} lines that grew most since the "
            f"{'last epoch' if trainer.current_epoch else 'start'}:",
            *(f"  {stat}" for stat in grown),
            "",
        ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:  # one write per epoch: a reader sees whole epochs
            handle.write("\n".join(lines) + "\n")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._last = None
        if self._started:
            tracemalloc.stop()
            self._started = False

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing to resume: a resumed run diffs from its own start


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(_NOT_THE_JOB)
