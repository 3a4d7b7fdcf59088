"""What the ranks of a distributed job decide together: a decision one rank takes alone (save
now, stop now) would leave the others waiting in a collective that never comes.

A SIGTERM reaches the ranks one by one (or one only: the job's process, which forwards it), and
a save every ``every_s`` seconds falls due by each rank's own clock, so each rank says what it
would do and all do what any would: one ``max`` over the ranks of a few flags, once per batch,
only where the job has more than one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["any_rank"]


def any_rank(trainer: pl.Trainer, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true on every rank where it is true on any (unchanged with one process)."""
    if trainer.world_size <= 1:
        return flags
    import torch

    mine = torch.tensor([float(flag) for flag in flags], device=trainer.strategy.root_device)
    agreed = trainer.strategy.reduce(mine, reduce_op="max")
    return tuple(bool(value) for value in agreed.tolist())
