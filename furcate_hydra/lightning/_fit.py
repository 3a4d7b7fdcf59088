"""``fit``: train a LightningModule as a furcate job (resume, history, plots, MLflow run).

JobEnv ──► resume_point(checkpoint_dir) ──► Trainer.fit(ckpt_path=...)
             the app's train DataLoader followed (ExactResume: position, its draws, RNG states)
             each epoch: MetricsHistory ──► history.json, AtomicCheckpoint ──► epoch=N.ckpt,
                         ProgressFile ──► progress.json (also every few seconds mid-epoch)
             every n steps / s seconds, or at SIGTERM/SIGUSR1: AtomicCheckpoint ──►
                         epoch=N-step=S.ckpt (a signal: then JobPreempted, exit status 75)
after fit: plots/*.png, final.ckpt (hard link) ──► artifacts of the job's run (if recording)
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.layout import JobPaths
from furcate_hydra.lightning._banners import lightning_banners
from furcate_hydra.lightning._fused_group import GroupEnv
from furcate_hydra.lightning._fused_member import alone_in_group, fit_in_group
from furcate_hydra.lightning._history import scalar_metrics
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._job_training import CHECKPOINT_ARTIFACT_DIR, JobTraining
from furcate_hydra.lightning._logger import bound_logger
from furcate_hydra.lightning._namespace import namespace_of, namespaces_of, trainer_namespace
from furcate_hydra.lightning._tracemalloc import TracemallocDiff, check_top

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "CHECKPOINT_ARTIFACT_DIR",
    "FINAL_CHECKPOINT_NAME",
    "FitResult",
    "building_in_fit",
    "fit",
]

FINAL_CHECKPOINT_NAME = JobPaths.FINAL_CHECKPOINT

# set while ``fit`` builds and fits its own Trainer: the hooks that reach an app's own Trainer
# (hydra.launcher.lightning=auto) leave that one alone, fit has given it everything
_IN_FIT: contextvars.ContextVar[bool] = contextvars.ContextVar("furcate_in_fit", default=False)


def building_in_fit() -> bool:
    """True while ``fit`` builds or fits its Trainer."""
    return _IN_FIT.get()


@contextmanager
def _in_fit() -> Iterator[None]:
    token = _IN_FIT.set(True)
    try:
        yield
    finally:
        _IN_FIT.reset(token)


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

    Resuming is exact: the app's own train DataLoader is kept as it is, and a checkpoint
    within an epoch holds the random states that epoch's iterator was made from and those its
    next batch loads from, so a job resumed after batch k replays the epoch's first k batches
    (loaded, not trained) and trains batch k+1 as the uninterrupted job would have (where the
    loader cannot be followed, e.g. workers that persist across epochs, the job resumes at the
    start of the interrupted epoch).
    Besides every epoch, it checkpoints every ``env.checkpoint_every_n_steps`` steps and
    ``env.checkpoint_every_s`` seconds if set, and at once on SIGTERM or SIGUSR1, after which it
    raises :class:`~furcate_hydra.preemption.JobPreempted` (the launcher re-queues the job).

    The Trainer is of the model's Lightning namespace (``lightning.pytorch`` or
    ``pytorch_lightning``); a datamodule or callback of the other one is refused. It gets
    :class:`MetricsHistory` and :class:`AtomicCheckpoint` after the callbacks in
    ``trainer_options`` (so its epoch checkpoint holds their final state too),
    :class:`OptunaPruning` when the Optuna sweeper launched this job as a trial with a
    monitored metric, and an ``MLFlowLogger`` of its namespace bound to the job's run (see
    :class:`RunBoundMLFlowLogger`) when ``env.recording``.
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
    namespace = namespace_of(model)
    if namespace is None:
        raise FurcateConfigError(
            "model",
            type(model).__qualname__,
            "must be a LightningModule (of lightning.pytorch or pytorch_lightning)",
            "pass an instance of your LightningModule subclass",
        )
    options = _trainer_options(trainer_options, env)
    user_callbacks = options.pop("callbacks")
    training = JobTraining(env, (TracemallocDiff(env.paths.tracemalloc, top),) if top else ())
    logger = bound_logger(namespace, env) if env.recording else False
    before, after = training.callbacks(user_callbacks)
    with _in_fit(), lightning_banners(shown=banners):
        trainer = namespace.trainer_class(
            **options,
            logger=logger,
            callbacks=[*before, *user_callbacks, *after],
            # False would make Lightning reject our Checkpoint callbacks; with them present it
            # adds no ModelCheckpoint of its own
            enable_checkpointing=True,
        )
        trainer_namespace(
            trainer,
            [
                ("datamodule", datamodule),
                *(("trainer_options.callbacks", c) for c in user_callbacks),
            ],
        )
        resume = training.resume_from(trainer)
        data = {
            "model": model,
            "train_dataloaders": train_dataloaders,
            "val_dataloaders": val_dataloaders,
            "datamodule": datamodule,
        }
        group = GroupEnv.from_environ()
        with training.fitting(trainer, namespace):
            fused = None
            if group is not None:
                resumes = resume is not None
                fused = fit_in_group(group, type(trainer).fit, trainer, training, data, resumes)
            if fused is not None:
                training.checkpoint.save(trainer)  # its end, as its run's last checkpoint
            else:
                with alone_in_group(group, training) as kept:
                    if kept is not None:  # its group's leader was gone after some epochs
                        resume = training.resume_from(trainer)
                    trainer.fit(
                        **data,
                        ckpt_path=resume.path if resume else None,
                        # our own files, verified by their sha256; they hold the RNG states too
                        weights_only=False,
                    )
    finished = training.finish(trainer)
    resumed_at = resume.at if resume else None
    return FitResult(
        metrics=scalar_metrics(trainer.callback_metrics),
        epochs_completed=trainer.current_epoch,
        resumed_from=resume.path if resume else None,
        resumed_at_epoch=None if resumed_at is None else resumed_at[0],
        resumed_at_batch=None if resumed_at is None else resumed_at[1],
        history_path=finished.history_path,
        plot_paths=finished.plot_paths,
        checkpoint_path=finished.checkpoint_path,
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
    if namespaces_of(callbacks):  # one Callback, not a list
        callbacks = [callbacks]
    if not isinstance(callbacks, list | tuple) or not all(namespaces_of(cb) for cb in callbacks):
        raise FurcateConfigError(
            "trainer_options.callbacks",
            callbacks,
            "must be a Callback or a list of them",
            "pass instantiated Lightning callbacks",
        )
    options["callbacks"] = list(callbacks)
    options.setdefault("default_root_dir", str(env.output_dir))
    return options
