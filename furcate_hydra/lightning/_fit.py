"""``fit``: train a LightningModule as a furcate job (resume, history, plots, MLflow run).

JobEnv ──► resume_point(checkpoint_dir) ──► Trainer.fit(ckpt_path=...)
             the train DataLoader remade resumable (ExactResume: order, position, RNG states)
             each epoch: MetricsHistory ──► history.json, AtomicCheckpoint ──► epoch=N.ckpt,
                         ProgressFile ──► progress.json (also every few seconds mid-epoch)
             every n steps / s seconds, or at SIGTERM/SIGUSR1: AtomicCheckpoint ──►
                         epoch=N-step=S.ckpt (a signal: then JobPreempted, exit status 75)
after fit: plots/*.png, final.ckpt (hard link) ──► artifacts of the job's run (if recording)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from mlflow.tracking import MlflowClient
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.known_warnings import ignore_lightning_pytree_deprecation
from furcate_hydra.layout import JobPaths
from furcate_hydra.lightning._banners import lightning_banners
from furcate_hydra.lightning._checkpoint import AtomicCheckpoint
from furcate_hydra.lightning._exact_resume import ExactResume, run_seed
from furcate_hydra.lightning._history import MetricsHistory, scalar_metrics
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._logger import RunBoundMLFlowLogger
from furcate_hydra.lightning._plots import PLOTS_DIR, plot_history
from furcate_hydra.lightning._pointer import resume_point
from furcate_hydra.lightning._preemption import PreemptionWatch
from furcate_hydra.lightning._progress import ProgressFile
from furcate_hydra.lightning._pruning import OptunaPruning
from furcate_hydra.lightning._tracemalloc import TracemallocDiff, check_top
from furcate_hydra.preemption import JobPreempted

__all__ = ["CHECKPOINT_ARTIFACT_DIR", "FINAL_CHECKPOINT_NAME", "FitResult", "fit"]

FINAL_CHECKPOINT_NAME = JobPaths.FINAL_CHECKPOINT
CHECKPOINT_ARTIFACT_DIR = JobPaths.CHECKPOINTS


@dataclass(frozen=True)
class FitResult:
    """What one ``fit`` did.

    Attributes:
        metrics: ``trainer.callback_metrics`` after fit, as floats (non-scalars left out).
        epochs_completed: ``trainer.current_epoch`` after fit, counting resumed epochs.
        resumed_from: The verified checkpoint training resumed from, or None.
        resumed_at_epoch: The first epoch this fit ran when resuming, or None.
        resumed_at_batch: The batch of that epoch it continued with (0: the epoch's start).
        history_path: ``history.json`` in the output dir.
        plot_paths: The PNGs under ``<output_dir>/plots/``.
        checkpoint_path: ``<output_dir>/final.ckpt``, or None when no checkpoint exists (and on
            ranks other than zero).
    """

    metrics: dict[str, float]
    epochs_completed: int
    resumed_from: Path | None
    resumed_at_epoch: int | None
    history_path: Path
    plot_paths: list[Path]
    checkpoint_path: Path | None
    resumed_at_batch: int | None = None


def fit(
    model: pl.LightningModule,
    *,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: pl.LightningDataModule | None = None,
    trainer_options: Mapping[str, Any] | None = None,
    env: JobEnv | None = None,
    banners: bool = False,
    tracemalloc_top: int = 0,
) -> FitResult:
    """Train ``model``, resuming from the run's last verified checkpoint if there is one.

    Resuming is exact: the train DataLoader is made again with a sampler whose order and
    position travel in the checkpoint, with the random-number states, so a job resumed after
    batch k trains batch k+1 as the uninterrupted job would have (where the loader cannot be
    remade, e.g. an IterableDataset, the job resumes at the start of the interrupted epoch).
    Besides every epoch, it checkpoints every ``env.checkpoint_every_n_steps`` steps and
    ``env.checkpoint_every_s`` seconds if set, and at once on SIGTERM or SIGUSR1, after which it
    raises :class:`~furcate_hydra.preemption.JobPreempted` (the launcher re-queues the job).

    The trainer gets :class:`MetricsHistory` and :class:`AtomicCheckpoint` ahead of the callbacks
    in ``trainer_options``, :class:`OptunaPruning` when the Optuna sweeper launched this job as a
    trial with a monitored metric, and a :class:`RunBoundMLFlowLogger` when ``env.recording``.
    The final checkpoint is hard-linked (copied where links fail) into the output dir as
    ``final.ckpt``, so it costs no space and outlives pruning. When recording, ``history.json``,
    ``plots/*.png`` and ``checkpoints/final.ckpt`` become artifacts of the run;
    the run's status is left alone.

    Args:
        model: The module to train.
        train_dataloaders: Passed to ``Trainer.fit``.
        val_dataloaders: Passed to ``Trainer.fit``.
        datamodule: Passed to ``Trainer.fit``.
        trainer_options: ``Trainer`` arguments. ``logger`` and ``enable_checkpointing`` belong to
            ``fit`` (only absent, None or True are accepted); ``default_root_dir`` defaults to the
            output dir.
        env: Where to write and what run to record into; read from the environment by default.
        banners: Let Lightning log its start-up lines (``GPU available: …``, ``TPU available:
            …``, ``💡 Tip: …``), which every job of a sweep prints alike; left out by default.
            Lightning's other messages and warnings are shown either way.
        tracemalloc_top: With N > 0, Python's ``tracemalloc`` traces the job's allocations and
            each training epoch's end appends the N source lines whose allocations grew most
            since the last epoch to ``tracemalloc.txt`` in the output dir (furcate's option).
            Tracing slows Python code down several times: for finding a leak, not for sweeps.

    Returns:
        A :class:`FitResult`.

    Raises:
        FurcateConfigError: ``trainer_options`` sets something ``fit`` owns, or
            ``tracemalloc_top`` is no count.
        JobPreempted: SIGTERM or SIGUSR1 came while training; the checkpoint it saved is where
            the next attempt resumes.
    """
    top = check_top(tracemalloc_top)
    env = env if env is not None else JobEnv.from_environ()
    options = _trainer_options(trainer_options, env)
    user_callbacks = options.pop("callbacks")
    if top:
        user_callbacks.append(TracemallocDiff(env.paths.tracemalloc, top))
    history = MetricsHistory(env.output_dir)
    every_n, every_s = env.checkpoint_every_n_steps, env.checkpoint_every_s
    # time checkpoints are on by default under the launcher: only asked-for step ones warn
    exact = ExactResume(run_seed(), warn_if_not_exact=every_n is not None)
    watch = PreemptionWatch()
    checkpoint = AtomicCheckpoint(
        env.checkpoint_dir, every_n_steps=every_n, every_s=every_s, watch=watch, exact=exact
    )
    pruning = OptunaPruning.from_environ()
    if pruning is not None:
        user_callbacks.append(pruning)
    logger: Logger | bool = RunBoundMLFlowLogger.from_env(env) if env.recording else False
    ignore_lightning_pytree_deprecation()
    found = resume_point(env.checkpoint_dir)
    resume, resumed_at = (found[0], found[1].resumes_at) if found is not None else (None, None)
    with lightning_banners(shown=banners):
        trainer = pl.Trainer(
            **options,
            logger=logger,
            # history first: the row of an epoch must be in the checkpoint saved for that epoch;
            # exact next: it puts the RNG states back before anything else draws at train start
            callbacks=[
                history,
                exact,
                checkpoint,
                ProgressFile(env.paths.progress),
                *user_callbacks,
            ],
            # False would make Lightning reject our Checkpoint callbacks; with them present it
            # adds no ModelCheckpoint of its own
            enable_checkpointing=True,
        )
        exact.attach(trainer)
        watch.install()
        try:
            trainer.fit(
                model,
                train_dataloaders=train_dataloaders,
                val_dataloaders=val_dataloaders,
                datamodule=datamodule,
                ckpt_path=resume,
                # our own files, verified by their sha256; they hold the RNG states too
                weights_only=False,
            )
        except SIGTERMException:
            # Lightning's handler won the race (a signal before the watch took it back)
            if watch.signal_name is None:
                raise
            raise JobPreempted(watch.signal_name, None) from None
        finally:
            watch.restore()

    history_path = history.path
    plots: list[Path] = []
    kept: Path | None = None
    if trainer.is_global_zero:
        history.write()
        plots = plot_history(history.rows, env.output_dir)
        final = checkpoint.last_saved or resume
        if final is not None:
            kept = _link_or_copy(final, env.paths.final_checkpoint)
        if env.tracking_uri is not None and env.run_id is not None:  # env.recording
            _log_artifacts(MlflowClient(env.tracking_uri), env.run_id, history_path, plots, kept)
    return FitResult(
        metrics=scalar_metrics(trainer.callback_metrics),
        epochs_completed=trainer.current_epoch,
        resumed_from=resume,
        resumed_at_epoch=None if resumed_at is None else resumed_at[0],
        resumed_at_batch=None if resumed_at is None else resumed_at[1],
        history_path=history_path,
        plot_paths=plots,
        checkpoint_path=kept,
    )


def _trainer_options(given: Mapping[str, Any] | None, env: JobEnv) -> dict[str, Any]:
    options = dict(given or {})
    for key, why in (
        ("logger", "fit logs into the job's MLflow run itself"),
        ("enable_checkpointing", "fit always checkpoints every epoch with AtomicCheckpoint"),
    ):
        if options.get(key, True) not in (None, True):
            raise FurcateConfigError(
                f"trainer_options.{key}", options[key], why, f"remove {key} from trainer_options"
            )
        options.pop(key, None)
    callbacks = options.get("callbacks") or []
    if isinstance(callbacks, pl.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, list | tuple) or not all(
        isinstance(cb, pl.Callback) for cb in callbacks
    ):
        raise FurcateConfigError(
            "trainer_options.callbacks",
            callbacks,
            "must be a Callback or a list of them",
            "pass instantiated pytorch_lightning callbacks",
        )
    options["callbacks"] = list(callbacks)
    options.setdefault("default_root_dir", str(env.output_dir))
    return options


def _link_or_copy(source: Path, target: Path) -> Path:
    # via a temporary name, so an existing final.ckpt is replaced in one step
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


def _log_artifacts(
    client: MlflowClient, run_id: str, history: Path, plots: list[Path], checkpoint: Path | None
) -> None:
    client.log_artifact(run_id, str(history))
    for plot in plots:
        client.log_artifact(run_id, str(plot), PLOTS_DIR)
    if checkpoint is not None:
        client.log_artifact(run_id, str(checkpoint), CHECKPOINT_ARTIFACT_DIR)
