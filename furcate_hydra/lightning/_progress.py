"""Tell the launcher where training is: ``progress.json`` in the job dir, kept current."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from furcate_hydra.lightning._history import scalar_metrics
from furcate_hydra.lightning._namespace import CheckpointBase
from furcate_hydra.progress import write_progress

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ProgressFile"]


class ProgressFile(CheckpointBase):
    """Rewrite ``path`` after each validation and epoch, and every ``every_s`` during an epoch.

    A ``Checkpoint`` only for hook order, as :class:`MetricsHistory`: Lightning runs checkpoint
    callbacks after ``LightningModule.on_train_epoch_end``, where epoch metrics are often logged.

    Args:
        path: The job's progress file (``JobPaths.progress``).
        every_s: Least seconds between two writes while batches run; a long epoch still shows
            its steps, a fast one costs no more than a write per epoch.
    """

    def __init__(self, path: Path, every_s: float = 5.0) -> None:
        self.path = path
        self.every_s = every_s
        self._written = 0.0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object
    ) -> None:
        if time.monotonic() - self._written >= self.every_s:
            self._write(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._write(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer)

    def _write(self, trainer: pl.Trainer) -> None:
        if not trainer.is_global_zero:
            return
        self._written = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        metrics = scalar_metrics(trainer.callback_metrics)
        write_progress(self.path, trainer.current_epoch, trainer.global_step, metrics)
