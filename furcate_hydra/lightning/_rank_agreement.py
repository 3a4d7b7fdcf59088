"""What the ranks of a distributed job decide together: a decision one rank takes alone (save
now, stop now) would leave the others waiting in a collective that never comes; and how a rank
leaves its process group when its process exits.

A SIGTERM reaches the ranks one by one (or one only: the job's process, which forwards it), and
a save every ``every_s`` seconds falls due by each rank's own clock, so each rank says what it
would do and all do what any would: one ``max`` over the ranks of a few flags, once per batch,
only where the job has more than one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["any_rank", "leave_group_at_exit"]

_leaving = False  # leave_group_at_exit registered in this process


def any_rank(trainer: pl.Trainer, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true on every rank where it is true on any (unchanged with one process)."""
    if trainer.world_size <= 1:
        return flags
    import torch

    mine = torch.tensor([float(flag) for flag in flags], device=trainer.strategy.root_device)
    agreed = trainer.strategy.reduce(mine, reduce_op="max")
    return tuple(bool(value) for value in agreed.tolist())


def leave_group_at_exit() -> None:
    """Destroy this process's process group when it exits normally, once per process.

    A rank that ``ddp_spawn`` or the subprocess launcher started ends with an ordinary
    interpreter exit; a gloo group still alive then is torn down with the interpreter, and its
    threads abort the process now and then ("terminate called without an active exception",
    SIGABRT), which Lightning reports as the job's failure after training has finished. A job's
    own process ends with ``os._exit`` and never gets there.
    """
    global _leaving
    if _leaving:
        return
    _leaving = True
    import atexit

    atexit.register(_destroy_group)


def _destroy_group() -> None:
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # exiting anyway: a group that cannot be destroyed is left to the OS
        pass
