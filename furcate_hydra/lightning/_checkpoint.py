"""Checkpoints that a relaunched job can trust: at every epoch's end, every n steps or s
seconds within an epoch, and at once when the job is asked to stop.

    epoch end ─────────────────────────────► epoch=0003.ckpt
    a batch end, n steps or s seconds since
      the last save, or a stop requested ───► epoch=0003-step=00000123.ckpt
    each: .<name>.tmp ─ fsync ─ rename ─► last.json (newest first, with sha256) ─► prune
    a stop requested: saved ─► JobPreempted (the job exits PREEMPTED_EXIT_CODE)

Only a batch after which nothing is pending saves within an epoch: its gradients applied (not
mid-accumulation), no validation due before the next batch, not the epoch's last batch (the
epoch's own checkpoint follows). Lightning restores its loops from such a checkpoint at the
next batch; ``ExactResume`` restores the data order and the random-number states.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.lightning._exact_resume import ExactResume, batches_done
from furcate_hydra.lightning._namespace import CheckpointBase
from furcate_hydra.lightning._pointer import (
    POINTER_NAME,
    TMP_RE,
    CheckpointCorruptWarning,
    CheckpointEntry,
    CheckpointPointer,
    checkpoint_files,
    final_checkpoint,
    find_resume_checkpoint,
    fsync_dir,
    read_pointer,
    sha256_of,
    write_pointer,
)
from furcate_hydra.lightning._preemption import PreemptionWatch
from furcate_hydra.lightning._rank_agreement import any_rank, leave_group_at_exit
from furcate_hydra.preemption import JobPreempted

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "POINTER_NAME",
    "AtomicCheckpoint",
    "CheckpointCorruptWarning",
    "CheckpointPointer",
    "final_checkpoint",
    "find_resume_checkpoint",
    "read_pointer",
]


class AtomicCheckpoint(CheckpointBase):
    """Save checkpoints, never leaving a half-written one, and keep only what resuming needs.

    It is a ``Checkpoint`` so that Lightning runs it last at epoch end: after the epoch's
    validation, after ``LightningModule.on_train_epoch_end`` and after every other callback, so the
    saved state is the epoch's final state. At that point ``trainer.current_epoch`` is still the
    finished epoch while the fit loop already counts it as processed, which is exactly what makes
    ``fit(ckpt_path=...)`` continue at the next epoch.

    Every rank calls ``trainer.save_checkpoint`` (the strategy may need all of them); only global
    rank zero renames, writes the pointer and prunes. Strategies that shard a checkpoint into a
    directory (FSDP, DeepSpeed) are not supported.

    Args:
        dirpath: Directory of the checkpoints and ``last.json``; created if missing.
        keep: How many checkpoints to keep, newest first (older ones are what a resume falls
            back to when a newer one turns out damaged).
        every_n_steps: Also save within an epoch once this many optimizer steps passed since
            the last save; None: not by steps.
        every_s: Also save within an epoch once this many seconds passed since the last save;
            None: not by time.
        watch: The job's stop signals: when one came, save at the next batch that can and
            raise :class:`~furcate_hydra.preemption.JobPreempted`.
        exact: Whether the training data can resume mid-epoch; without it no checkpoint is
            taken within an epoch (a stop then saves nothing new: the job resumes from the
            last epoch's checkpoint).
    """

    def __init__(
        self,
        dirpath: Path,
        keep: int = 2,
        every_n_steps: int | None = None,
        every_s: float | None = None,
        watch: PreemptionWatch | None = None,
        exact: ExactResume | None = None,
    ) -> None:
        if keep < 1:
            raise FurcateConfigError(
                "keep", keep, "must be at least 1 (last.json names a kept file)", "pass keep>=1"
            )
        if every_n_steps is not None and every_n_steps < 1:
            raise FurcateConfigError(
                "every_n_steps", every_n_steps, "must be at least 1", "pass None or a count >= 1"
            )
        if every_s is not None and every_s <= 0:
            raise FurcateConfigError(
                "every_s", every_s, "must be a positive number of seconds", "pass None or > 0"
            )
        self.dirpath = Path(dirpath)
        self.keep = keep
        self.every_n_steps = every_n_steps
        self.every_s = every_s
        self.watch = watch
        self.exact = exact
        self.last_saved: Path | None = None
        self._last_step = 0
        self._last_time = time.monotonic()
        self._stopping: JobPreempted | None = None  # saved: raised at the next hook

    # -- Lightning's hooks ---------------------------------------------------------------

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.watch is not None:
            self.watch.reclaim()  # Lightning has just put its own SIGTERM handler in place

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.watch is not None:
            self.watch.reclaim()
        self._last_step, self._last_time = trainer.global_step, time.monotonic()
        if trainer.world_size > 1:
            leave_group_at_exit()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        stop, due = self._stop_or_due(trainer)
        if not (stop or due) or _debugging(trainer):
            return
        if self.exact is None or not self.exact.resumable:
            if stop:
                self._stop(None)  # nothing to save that could resume exactly
            return
        if not _nothing_pending(trainer):
            return  # the next batch that can save will
        saved = self.save(trainer, batch=batches_done(trainer))
        if stop:
            self._stop(saved)

    # a stop whose checkpoint is saved waits for the next of these: Lightning hands the
    # batch's or the epoch's values to the loggers after the hook that saved, and a resumed
    # run continues after them, so its loggers would never get them otherwise
    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._stop_now()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_now()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_now()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a debugging run must not become the run's resume point
        if _debugging(trainer):
            return
        done, planned = batches_done(trainer), trainer.num_training_batches
        # an epoch cut short (max_steps, a module returning -1) ends where training stopped;
        # one of unknown length (an iterable dataset) ends when its data does
        saved = self.save(trainer, done if math.isfinite(planned) and done < planned else None)
        if self._stop_or_due(trainer, due=False)[0]:
            self._stop(saved)

    # -- saving --------------------------------------------------------------------------

    def save(self, trainer: pl.Trainer, batch: int | None = None) -> Path:
        """Write the trainer's checkpoint and put it first in ``last.json``.

        ``batch``: None at an epoch's end; within an epoch, how many of its batches trained.
        """
        epoch, step = trainer.current_epoch, trainer.global_step
        name = (
            f"epoch={epoch:04d}.ckpt"
            if batch is None
            else f"epoch={epoch:04d}-step={step:08d}.ckpt"
        )
        final = self.dirpath / name
        # the same name on every rank, in case the strategy compares or gathers paths
        tmp = self.dirpath / f".{name}.tmp"
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        # the full state (optimizers, loops, callbacks) is what resuming needs; left unset,
        # Lightning says it defaulted to that, in a log line per epoch
        trainer.save_checkpoint(tmp, weights_only=False)
        self._last_step, self._last_time = step, time.monotonic()
        if not trainer.is_global_zero:
            return final
        return self._keep(tmp, final, epoch, step, batch)

    def save_state(self, checkpoint: dict[str, Any], epoch: int, step: int) -> Path:
        """Keep ``checkpoint`` (a Lightning checkpoint made elsewhere: a fused member's, by
        its group's leader) as the checkpoint at the end of ``epoch``, as ``save`` would."""
        name = f"epoch={epoch:04d}.ckpt"
        final, tmp = self.dirpath / name, self.dirpath / f".{name}.tmp"
        self.dirpath.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, tmp)
        return self._keep(tmp, final, epoch, step, None)

    def _keep(self, tmp: Path, final: Path, epoch: int, step: int, batch: int | None) -> Path:
        """Move a written checkpoint into place and put it first in ``last.json``."""
        name = final.name
        digest = sha256_of(tmp, fsync=True)
        os.replace(tmp, final)
        fsync_dir(self.dirpath)
        entry = CheckpointEntry(name, digest, epoch, step, time.time(), batch)
        older = read_pointer(self.dirpath)
        kept = (entry, *(e for e in (older.entries if older else ()) if e.file != name))
        write_pointer(self.dirpath, CheckpointPointer.of(kept[: self.keep]))
        self._prune({e.file for e in kept[: self.keep]})
        self.last_saved = final
        return final

    def _stop_or_due(self, trainer: pl.Trainer, due: bool | None = None) -> tuple[bool, bool]:
        """Whether to stop (a preemption signal was noted) and to save (``_due``, unless
        given), as every rank of a distributed job agrees: any rank's yes is each rank's."""
        stop = self.watch is not None and self.watch.signal_name is not None
        stop, due = any_rank(trainer, stop, self._due(trainer) if due is None else due)
        if stop and self.watch is not None and self.watch.signal_name is None:
            self.watch.signal_name = "a preemption signal to another rank"
        return stop, due

    def _due(self, trainer: pl.Trainer) -> bool:
        by_steps = (
            self.every_n_steps is not None
            and trainer.global_step - self._last_step >= self.every_n_steps
        )
        by_time = self.every_s is not None and time.monotonic() - self._last_time >= self.every_s
        return by_steps or by_time

    def _stop(self, saved: Path | None) -> None:
        assert self.watch is not None and self.watch.signal_name is not None
        if saved is None:
            warnings.warn(
                f"furcate: {self.watch.signal_name} mid-epoch, but the training data cannot "
                "resume mid-epoch: the job stops without a new checkpoint and resumes from "
                "the start of this epoch",
                stacklevel=2,
            )
        stop = JobPreempted(self.watch.signal_name, None if saved is None else saved.name)
        if saved is None:
            raise stop
        self._stopping = stop

    def _stop_now(self) -> None:
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            raise stopping

    def _prune(self, keep: set[str]) -> None:
        # files the pointer no longer names: older saves, or an earlier attempt's files that
        # could not be verified (moved-aside ones end in .corrupt and are left alone)
        for stale in checkpoint_files(self.dirpath):
            if stale.name not in keep:
                stale.unlink(missing_ok=True)
        for leftover in self.dirpath.iterdir():
            if TMP_RE.match(leftover.name):
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _debugging(trainer: pl.Trainer) -> bool:
    fast_dev_run = trainer.fast_dev_run  # type: ignore[attr-defined]  # set outside __init__
    return bool(fast_dev_run) or trainer.sanity_checking


def _nothing_pending(trainer: pl.Trainer) -> bool:
    """After this batch, nothing is left half-done that the checkpoint would miss."""
    loop = trainer.fit_loop.epoch_loop
    done = batches_done(trainer)
    if done % trainer.accumulate_grad_batches != 0:
        return False  # gradients accumulated so far are not in any state_dict
    if done >= trainer.num_training_batches:
        return False  # the epoch's own checkpoint follows, after its validation
    data_fetcher = trainer.fit_loop._data_fetcher
    try:
        # Lightning would skip a validation due right after this batch when it resumes here
        return data_fetcher is None or not loop._should_check_val_fx(data_fetcher)
    except Exception:  # another Lightning: validate only at epoch ends, as by default
        return True
