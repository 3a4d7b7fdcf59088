"""What a fused step may read of its Trainer: where training is, the same for every member.

In its own run a member's module is attached to a Trainer while it trains, and its steps read
``self.current_epoch`` or ``self.global_step`` (a warm-up, a schedule of its own) from it. A
fused group trains every member one epoch and one optimizer step at a time, so those are the
group's; the module running the group's steps is attached to this view for the fit. Anything
else a step reads of ``self.trainer`` stops the probe, a reason to run alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from furcate_hydra.fusion.step_logs import UnfusableStep


class TrainerView:
    """The Trainer as a fused step sees it: the epoch, the optimizer steps taken, one process."""

    def __init__(self) -> None:
        self.current_epoch = 0
        self.global_step = 0
        self.global_rank = 0
        self.local_rank = 0
        self.node_rank = 0
        self.world_size = 1
        self.is_global_zero = True

    def __getattr__(self, name: str) -> Any:
        raise UnfusableStep(f"its steps read self.trainer.{name}")

    def __bool__(self) -> bool:
        return True


@contextmanager
def attached(module: Any, view: TrainerView) -> Iterator[TrainerView]:
    """``module`` (and the LightningModules inside it) attached to ``view`` while the block
    runs, as Lightning attaches a module to the Trainer that fits it."""
    held = [(m, m.__dict__.get("_trainer")) for m in _lightning_modules(module)]
    for m, _ in held:
        object.__setattr__(m, "_trainer", view)
    try:
        yield view
    finally:
        for m, trainer in held:
            object.__setattr__(m, "_trainer", trainer)


def _lightning_modules(module: Any) -> list[Any]:
    """``module`` and the modules in it that are attached to a Trainer the Lightning way."""
    modules = getattr(module, "modules", None)
    found = list(modules()) if callable(modules) else [module]
    return [m for m in found if "_trainer" in vars(m)]
