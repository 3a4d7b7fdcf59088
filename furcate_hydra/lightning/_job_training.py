"""What furcate adds to one Trainer in a job, whoever built it: ``fit`` or the app itself.

    JobTraining(env)
      callbacks: MetricsHistory, ExactResume, AtomicCheckpoint, ProgressFile, OptunaPruning
                 (those the Trainer does not have already)
      resume_from(trainer) ──► the newest verified checkpoint of the run, or the app's own
                               last.ckpt where that is newer (ckpt_path for Trainer.fit)
      fitting(trainer): ExactResume follows the train data; SIGTERM/SIGUSR1 noted, then
                        checkpoint at the step and JobPreempted
      finish(trainer): history.json, plots/, final.ckpt, artifacts of the job's run

The launcher re-queues a preempted job and the next attempt resumes from the checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient

from furcate_hydra.atomic import link_or_copy
from furcate_hydra.known_warnings import (
    ignore_lightning_pytree_deprecation,
    ignore_lightning_srun_hint,
)
from furcate_hydra.lightning._app_checkpoints import AppCheckpoints, save_app_checkpoints
from furcate_hydra.lightning._checkpoint import AtomicCheckpoint
from furcate_hydra.lightning._exact_resume import ExactResume, run_seed
from furcate_hydra.lightning._history import MetricsHistory
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._namespace import Namespace
from furcate_hydra.lightning._plots import PLOTS_DIR, plot_history
from furcate_hydra.lightning._pointer import final_checkpoint, resume_point
from furcate_hydra.lightning._preemption import PreemptionWatch
from furcate_hydra.lightning._progress import ProgressFile
from furcate_hydra.lightning._pruning import OptunaPruning
from furcate_hydra.preemption import JobPreempted

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["CHECKPOINT_ARTIFACT_DIR", "Finished", "JobTraining", "ResumePoint"]

# the job's run keeps its final checkpoint under this artifact folder
CHECKPOINT_ARTIFACT_DIR = "checkpoints"


@dataclass(frozen=True)
class ResumePoint:
    """Where a fit resumes: the checkpoint, and (epoch, batch) when furcate saved it."""

    path: Path
    at: tuple[int, int] | None
    by_app: bool = False  # the app's own last.ckpt, newer than furcate's


@dataclass(frozen=True)
class Finished:
    """What ``finish`` wrote: ``history.json``, the plots and ``final.ckpt`` (or None)."""

    history_path: Path
    plot_paths: list[Path]
    checkpoint_path: Path | None


def spawns_ranks(trainer: pl.Trainer) -> bool:
    """Whether ``fit`` trains in processes it spawns (``ddp_spawn``), not in this one."""
    launcher = getattr(trainer.strategy, "launcher", None)
    return type(launcher).__name__ == "_MultiProcessingLauncher"


class JobTraining:
    """furcate's part of one Trainer's fit in a job: callbacks before, files and run after.

    Args:
        env: The job's dirs and run.
        extra: Callbacks that go with furcate's (``fit``'s tracemalloc diff).
    """

    def __init__(self, env: JobEnv, extra: tuple[Any, ...] = ()) -> None:
        self.env = env
        ignore_lightning_srun_hint()  # before fit builds its Trainer
        every_n, every_s = env.checkpoint_every_n_steps, env.checkpoint_every_s
        self.history = MetricsHistory(env.output_dir)
        # time checkpoints are on by default under the launcher: only asked-for step ones warn
        self.exact = ExactResume(run_seed(), warn_if_not_exact=every_n is not None)
        self.watch = PreemptionWatch()
        self.checkpoint = AtomicCheckpoint(
            env.checkpoint_dir, every_n_steps=every_n, every_s=every_s, watch=self.watch,
            exact=self.exact,
        )  # fmt: skip
        self.progress = ProgressFile(env.paths.progress, env.progress_every_s)
        self.pruning = OptunaPruning.from_environ()
        self.app_checkpoints = AppCheckpoints(env)
        self.extra = extra
        self.resumed: ResumePoint | None = None

    def callbacks(self, present: list[Any] | None = None) -> tuple[list[Any], list[Any]]:
        """furcate's callbacks to put before the Trainer's own and after them, less the kinds
        ``present`` has (an app that lists ``OptunaPruning.from_environ()`` keeps its own).

        Before: ``ExactResume`` (it puts the RNG states back before anything else draws at
        train start) and pruning. After, where Lightning runs checkpoint callbacks once the
        epoch is done: ``MetricsHistory`` then ``AtomicCheckpoint`` (an epoch's row must be in
        the checkpoint saved for it, which holds the epoch's final state, the app's checkpoint
        callbacks' included). The app's own ModelCheckpoint stays the Trainer's first
        checkpoint callback (``trainer.checkpoint_callback``).
        """
        kinds = {type(cb) for cb in present or []}
        before = [self.exact, *([self.pruning] if self.pruning.active else [])]
        after = [self.history, self.checkpoint, self.progress, *self.extra, self.app_checkpoints]
        return (
            [cb for cb in before if type(cb) not in kinds],
            [cb for cb in after if type(cb) not in kinds],
        )

    def resume_from(self, trainer: pl.Trainer) -> ResumePoint | None:
        """The checkpoint this job's fit continues from, or None for a fresh start."""
        found = resume_point(self.env.checkpoint_dir)
        ours = None if found is None else ResumePoint(found[0], found[1].resumes_at)
        theirs = self.app_checkpoints.newer_last(trainer, ours.path if ours else None)
        self.resumed = ResumePoint(theirs, None, by_app=True) if theirs else ours
        return self.resumed

    @contextlib.contextmanager
    def fitting(self, trainer: pl.Trainer, namespace: Namespace) -> Iterator[None]:
        """Around ``Trainer.fit``: resumable train data, and SIGTERM/SIGUSR1 as a preemption."""
        ignore_lightning_pytree_deprecation()
        self.exact.attach(trainer)
        self.watch.forward_to_children = spawns_ranks(trainer)
        self.watch.install()
        try:
            yield
        except namespace.sigterm_exception:
            # Lightning's handler won the race (a signal before the watch took it back)
            if self.watch.signal_name is None:
                raise
            raise JobPreempted(self.watch.signal_name, None) from None
        except Exception as exc:
            # ddp_spawn: the ranks stopped for the signal passed on to them, which Lightning
            # hands back as their processes' error
            if self.watch.signal_name is None or not self.watch.forward_to_children:
                raise
            raise JobPreempted(self.watch.signal_name, None) from exc
        finally:
            self.watch.restore()

    def finish(self, trainer: pl.Trainer) -> Finished:
        """After fit: history.json, plots and final.ckpt (rank zero), artifacts of the run."""
        history_path = self.history.path
        if self.exact.restored_untrained:  # resumed at its end: the app's files as its run's
            save_app_checkpoints(trainer)
        if not trainer.is_global_zero:
            return Finished(history_path, [], None)
        final = self.checkpoint.last_saved
        if spawns_ranks(trainer):
            # the ranks trained in processes of their own: rank 0 left its history and its
            # checkpoints on disk, and this process's callbacks saw nothing
            self.history.read()
            final = final_checkpoint(self.checkpoint.dirpath)
        self.history.write()
        plots = plot_history(self.history.rows, self.env.output_dir)
        final = final or (self.resumed.path if self.resumed else None)
        kept = link_or_copy(final, self.env.paths.final_checkpoint) if final else None
        env = self.env
        if env.tracking_uri is not None and env.run_id is not None:  # env.recording
            client = MlflowClient(env.tracking_uri)
            client.log_artifact(env.run_id, str(history_path))
            for plot in plots:
                client.log_artifact(env.run_id, str(plot), PLOTS_DIR)
            if kept is not None:
                client.log_artifact(env.run_id, str(kept), CHECKPOINT_ARTIFACT_DIR)
        return Finished(history_path, plots, kept)
