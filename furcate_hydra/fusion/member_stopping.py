"""Early stopping for each member with its own ``EarlyStopping`` callback, as its run would, and
its own Optuna pruning.

Each member's callback object (from its own Trainer) judges that member's monitored value
with Lightning's own rule (``_evaluate_stopping_criteria``: patience, ``min_delta``,
thresholds, a value that is not finite), at the point its run would judge it (the end of a
training epoch, or after validation where validation does not run once an epoch), so its
state (``wait_count``, ``best_score``, ``stopped_epoch``) is its own run's and goes into its
checkpoint. The values come from ``FinalMetrics``: what the member's ``callback_metrics``
would hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from furcate_hydra.fusion.final_metrics import FinalMetrics
from furcate_hydra.fusion.lineage import LIGHTNING, derives_from
from furcate_hydra.fusion.settings import TrainingShape
from furcate_hydra.fusion.step_logs import LogOptions


def early_stopping_callbacks(callbacks: Sequence[Any]) -> list[Any]:
    """The ``EarlyStopping`` callbacks (either Lightning namespace) among ``callbacks``."""
    return [cb for cb in callbacks if derives_from(cb, "EarlyStopping", LIGHTNING)]


class Pruning(Protocol):
    """A member's Optuna pruning (``lightning._pruning.OptunaPruning``), read as it runs after
    each validation: its monitored value reported for the epoch, True when its trial is
    pruned."""

    monitor: str

    def report(self, value: float, epoch: int) -> bool: ...


class MemberStopping:
    """A ``FusionObserver``: every member's final metrics, its early stopping and its Optuna
    pruning (``pruning``: each member's, or None)."""

    def __init__(
        self,
        callbacks: Sequence[Sequence[Any]],
        shape: TrainingShape,
        pruning: Sequence[Pruning | None] | None = None,
    ) -> None:
        self.final = FinalMetrics(len(callbacks))
        self.pruning = list(pruning) if pruning is not None else [None] * len(callbacks)
        self.stoppers = [early_stopping_callbacks(own) for own in callbacks]
        # where EarlyStopping's setup puts the check when the app leaves it unset
        every_epoch = shape.val_check_interval == 1.0 and shape.check_val_every_n_epoch == 1
        self.on_epoch_end = [
            [every_epoch if cb._check_on_train_epoch_end is None else cb._check_on_train_epoch_end
             for cb in own]
            for own in self.stoppers
        ]  # fmt: skip

    def _judge(self, epoch: int, at_epoch_end: bool) -> torch.Tensor:
        stop = torch.zeros(len(self.stoppers), dtype=torch.bool)
        for member, (own, when) in enumerate(zip(self.stoppers, self.on_epoch_end, strict=True)):
            if self.final.stopped_in[member] is not None:
                continue
            metrics = self.final.metrics[member]
            for callback, epoch_end in zip(own, when, strict=True):
                if epoch_end != at_epoch_end or callback.monitor not in metrics:
                    continue
                should, _ = callback._evaluate_stopping_criteria(
                    metrics[callback.monitor].squeeze()
                )
                if should:
                    callback.stopped_epoch = epoch
                    stop[member] = True
        return stop

    def train_step(
        self, step: int, epoch: int, logs: dict[str, torch.Tensor], options: dict[str, LogOptions]
    ) -> None:
        self.final.train_step(step, epoch, logs, options)

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        self.final.validation_end(step, epoch, means)
        stop = self._judge(epoch, at_epoch_end=False) | self._pruned(epoch)
        return self.final.stopped(stop, epoch)

    def _pruned(self, epoch: int) -> torch.Tensor:
        """Each member's trial told its value after validation, as its own run tells it."""
        stop = torch.zeros(len(self.pruning), dtype=torch.bool)
        for member, pruning in enumerate(self.pruning):
            metrics = self.final.metrics[member]
            if pruning is None or self.final.stopped_in[member] is not None:
                continue
            if pruning.monitor in metrics:
                stop[member] = pruning.report(float(metrics[pruning.monitor]), epoch)
        return stop

    def train_epoch_end(
        self, step: int, epoch: int, means: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        self.final.train_epoch_end(step, epoch, means)
        return self.final.stopped(self._judge(epoch, at_epoch_end=True), epoch)
