"""One row of metrics per epoch, kept in the checkpoint so a resumed run's history is whole."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.layout import JobPaths
from furcate_hydra.lightning._namespace import CheckpointBase

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["HISTORY_NAME", "MetricsHistory", "Row", "scalar_metrics"]

HISTORY_NAME = JobPaths.HISTORY

Row = dict[str, float | int]


class MetricsHistory(CheckpointBase):
    """Append ``{"epoch", "step", <metric>: float, ...}`` after every epoch to ``history.json``.

    A row is taken from ``trainer.callback_metrics`` once the epoch's training and validation are
    done; the file is rewritten atomically each epoch. The rows travel in the Lightning checkpoint
    (``state_dict``), so after a resume the file again holds every epoch from 0.

    It subclasses ``Checkpoint`` only for hook order: Lightning runs checkpoint callbacks after
    ``LightningModule.on_train_epoch_end`` (where epoch metrics are often logged; a plain callback
    would see them one epoch late) and in list order, so listed before :class:`AtomicCheckpoint`
    the epoch's row is in the checkpoint saved for that epoch.

    Two corrections to ``callback_metrics``: validation metrics are left out of epochs where no
    validation ran (``check_val_every_n_epoch``; Lightning keeps showing the last values), and
    Lightning's ``X_step``/``X_epoch`` copies are dropped where the plain ``X`` (the epoch value)
    is there.

    Args:
        directory: Where ``history.json`` goes; created if missing.
        filename: The file's name.
    """

    def __init__(self, directory: Path, filename: str = HISTORY_NAME) -> None:
        self.path = Path(directory) / filename
        self.rows: list[Row] = []
        self._val_keys: set[str] = set()
        self._before_val: dict[str, float] = {}
        self._validated = False
        # the callback metrics the latest row was taken from, unfiltered: a fit resumed with
        # nothing left to train hands them back to the app, as its uninterrupted fit ended
        self.ended_with: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from furcate_hydra.lightning._checkpoint import AtomicCheckpoint  # it imports us

        # the checkpoints a job resumes from must hold the epoch's row (an app's own
        # ModelCheckpoint saves at validation's end, before any row exists: a job resumed
        # from the app's last.ckpt misses that epoch's row)
        checkpoints = trainer.checkpoint_callbacks
        ahead = [
            type(cb).__name__
            for cb in checkpoints[: checkpoints.index(self)]
            if isinstance(cb, AtomicCheckpoint)
        ]
        if ahead:
            rank_zero_warn(
                f"MetricsHistory comes after {', '.join(ahead)} in the callbacks, so the "
                "checkpoints those save lack the epoch's row and a resumed history.json would "
                "miss epochs. List MetricsHistory before them."
            )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validated = False

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before_val = scalar_metrics(trainer.callback_metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a key validation created or changed is a validation metric (sanity check included)
        after = scalar_metrics(trainer.callback_metrics)
        self._val_keys.update(k for k, v in after.items() if not _same(self._before_val.get(k), v))
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = scalar_metrics(trainer.callback_metrics)
        self.add_row(trainer.current_epoch, trainer.global_step, metrics, self._validated)
        if trainer.is_global_zero:
            self.write()

    def add_row(
        self,
        epoch: int,
        step: int,
        metrics: Mapping[str, float],
        validated: bool,
        validation_names: tuple[str, ...] = (),
    ) -> None:
        """The row of ``epoch``, from the callback metrics at its end (a fused member's come
        from its group's leader, with the names its validation logged)."""
        self._val_keys.update(validation_names)
        self.ended_with = dict(metrics)
        if not validated:
            metrics = {k: v for k, v in metrics.items() if k not in self._val_keys}
        row: Row = {"epoch": epoch, "step": step}
        row.update((k, v) for k, v in metrics.items() if k not in row and not _is_copy(k, metrics))
        # a rerun of an epoch (resume from an older checkpoint) replaces what came after it
        self.rows = [r for r in self.rows if r["epoch"] < epoch] + [row]

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a resumed run with no epochs left still gets its restored history on disk, and the
        # metrics its last epoch ended with (an app reads them after fit)
        if not trainer.callback_metrics and self.ended_with:
            ended = {k: torch.tensor(v) for k, v in self.ended_with.items()}
            trainer._logger_connector._callback_metrics.update(ended)
        if trainer.is_global_zero and self.rows:
            self.write()

    def read(self) -> None:
        """Take the rows ``self.path`` holds (written by another process: rank 0 of
        ``ddp_spawn``), if it holds any."""
        try:
            rows = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(rows, list) and rows:
            self.rows = [dict(row) for row in rows if isinstance(row, dict)]

    def write(self) -> Path:
        """Write all rows to ``self.path`` atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, json.dumps(self.rows, indent=1).encode())
        return self.path

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "callback_metrics": dict(self.ended_with)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = [dict(r) for r in state_dict.get("rows", [])]
        self.ended_with = dict(state_dict.get("callback_metrics", {}))


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The one-number entries of ``metrics`` as floats, sorted by name; the rest are skipped."""
    out: dict[str, float] = {}
    for key in sorted(metrics):
        value = metrics[key]
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            out[key] = float(value.detach().cpu().item())
        elif isinstance(value, int | float):
            out[key] = float(value)
    return out


def _is_copy(key: str, metrics: Mapping[str, float]) -> bool:
    for suffix in ("_step", "_epoch"):
        if key.endswith(suffix) and key[: -len(suffix)] in metrics:
            return True
    return False


def _same(a: float | None, b: float) -> bool:
    return a is not None and (a == b or (math.isnan(a) and math.isnan(b)))
