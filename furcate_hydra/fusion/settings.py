"""The Trainer settings that shape training: what every member of a group must share."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TrainingShape:
    """What a Lightning ``Trainer`` decides about training, and a fused loop follows."""

    max_epochs: int
    max_steps: int  # -1: no limit
    limit_train_batches: int | float
    limit_val_batches: int | float
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    log_every_n_steps: int
    precision: str
    min_epochs: int = 0
    min_steps: int = 0

    @classmethod
    def from_trainer(cls, trainer: Any) -> TrainingShape:
        """Read from a built Lightning Trainer (either namespace)."""
        clip_algorithm = trainer.gradient_clip_algorithm
        return cls(
            max_epochs=int(trainer.max_epochs if trainer.max_epochs is not None else -1),
            max_steps=int(trainer.max_steps),
            limit_train_batches=trainer.limit_train_batches,
            limit_val_batches=trainer.limit_val_batches,
            accumulate_grad_batches=int(trainer.accumulate_grad_batches),
            gradient_clip_val=None
            if trainer.gradient_clip_val in (None, 0)
            else float(trainer.gradient_clip_val),
            gradient_clip_algorithm=str(getattr(clip_algorithm, "value", clip_algorithm) or "norm"),
            val_check_interval=trainer.val_check_interval,
            check_val_every_n_epoch=trainer.check_val_every_n_epoch,
            log_every_n_steps=int(trainer.log_every_n_steps),
            precision=str(trainer.precision),
            min_epochs=int(trainer.fit_loop.min_epochs or 0),
            min_steps=int(trainer.fit_loop.min_steps or 0),
        )

    def may_stop(self, epochs_done: int, steps: int) -> bool:
        """Whether a stop asked for (early stopping) may happen now: Lightning's
        ``min_epochs`` and ``min_steps`` met."""
        return epochs_done >= self.min_epochs and steps >= self.min_steps

    def differences(self, other: TrainingShape) -> list[str]:
        """The settings that differ from ``other``, by name."""
        mine, theirs = asdict(self), asdict(other)
        return [key for key in mine if mine[key] != theirs[key]]

    def refusals(self) -> list[str]:
        """Why a fused loop cannot follow these settings (empty: it can)."""
        reasons = []
        if self.precision != "32-true":
            reasons.append(f"its precision is {self.precision} (fused: 32-true)")
        if self.max_epochs < 0 and self.max_steps < 0:
            reasons.append("it trains without max_epochs or max_steps")
        if isinstance(self.val_check_interval, float) and self.val_check_interval != 1.0:
            reasons.append(f"it validates at a fraction of an epoch ({self.val_check_interval})")
        return reasons

    def batches(self, loader_length: int, limit: int | float) -> int:
        """How many batches of a loader of ``loader_length`` an epoch takes, as Lightning counts."""
        if isinstance(limit, int):
            return min(loader_length, limit)
        return int(loader_length * limit)
