"""An app's own Trainer, in a furcate job, gets what ``fit`` gives (``lightning: auto``).

    install(namespace), once per namespace the app imports (job_process.lightning_auto):
      MLFlowLogger(...)   ──► RunBound<its class>, built with the job's run and store;
                              in a DDP rank other than 0, no MLflow client (_lazy_client)
      Trainer(...)        ──► default_root_dir: the job dir unless the app set one;
                              + furcate's callbacks (JobTraining) the app has not listed;
                              + a bound MLflow logger unless the app's own is one;
                              a callback or logger of the other namespace refused
      trainer.fit(...)    ──► model and datamodule checked; ckpt_path: the run's resume point
                              when the app passes none; SIGTERM/SIGUSR1 as preemption; then
                              history.json, plots/, final.ckpt and the run's artifacts
      one log line per job says what was added

Lightning's own extension points cannot do all of it: a callback runs too late to choose the
checkpoint ``fit`` restores, and a logger pointed at a file store fails in its constructor.
So the job wraps ``Trainer.__init__``, ``Trainer.fit`` and ``MLFlowLogger.__new__`` /
``__init__`` of the app's namespace, as MLflow's autologging wraps ``fit``; a Trainer that
``fit`` builds is left to ``fit``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from furcate_hydra.lightning._fit import building_in_fit
from furcate_hydra.lightning._fused_group import GroupEnv
from furcate_hydra.lightning._fused_member import alone_in_group, fit_in_group
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._job_training import JobTraining, ResumePoint
from furcate_hydra.lightning._lazy_client import client_for_this_rank
from furcate_hydra.lightning._logger import RunBinding, bound_class, bound_logger, job_arguments
from furcate_hydra.lightning._namespace import Namespace, trainer_namespace
from furcate_hydra.lightning._slot_devices import check_trainer_devices

__all__ = ["install"]

log = logging.getLogger("furcate_hydra.lightning")

_ATTRIBUTE = "_furcate_training"  # the JobTraining of a Trainer built by the app, in a job
_ADDED = "_furcate_added"  # on the MLflow logger furcate added to such a Trainer
_installed: set[str] = set()
# the process that said the one line per job: a DDP rank forked from the job's process says
# its own, as one started anew does
_said_in: int | None = None


def install(namespace: str) -> None:
    """Wrap the Trainer and MLflow logger of ``namespace`` (imported) for this job's process."""
    if namespace in _installed:
        return
    _installed.add(namespace)
    ns = Namespace(namespace)
    trainer = ns.trainer_class
    _wrap(trainer, "__init__", _trainer_init)
    _wrap(trainer, "fit", _trainer_fit)
    env = JobEnv.from_environ()
    logger = ns.mlflow_logger_class
    # bound to the job's run where it records; in a DDP rank other than 0, no MLflow client
    _wrap(logger, "__init__", functools.partial(_logger_init, env if env.recording else None))
    if env.recording:
        logger.__new__ = staticmethod(_logger_new)


def _wrap(cls: Any, name: str, wrapper: Callable[..., Any]) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)  # keeps the signature that LightningCLI and others read
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    setattr(cls, name, wrapped)


# -- the Trainer ---------------------------------------------------------------------------


def _trainer_init(original: Callable[..., None], trainer: Any, *args: Any, **kwargs: Any) -> None:
    if building_in_fit():
        original(trainer, *args, **kwargs)
        return
    env = JobEnv.from_environ()
    call = inspect.signature(original).bind(trainer, *args, **kwargs)
    # the job's files go to its own dir, not to a lightning_logs/ shared by every job
    call.arguments.setdefault("default_root_dir", str(env.output_dir))
    check_trainer_devices(call.arguments)  # more GPUs than the slot has: say where to fix it
    original(*call.args, **call.kwargs)
    given = [("Trainer(callbacks=...)", cb) for cb in trainer.callbacks]
    given += [("Trainer(logger=...)", logger) for logger in trainer.loggers]
    namespace = trainer_namespace(trainer, given)
    training = JobTraining(env)
    before, after = training.callbacks(trainer.callbacks)
    # Lightning runs checkpoint callbacks last, in list order, when fit starts
    trainer.callbacks = [*before, *trainer.callbacks, *after]
    if env.recording and not any(isinstance(lg, RunBinding) for lg in trainer.loggers):
        added = bound_logger(namespace, env)
        setattr(added, _ADDED, True)
        trainer.loggers = [*trainer.loggers, added]
    setattr(trainer, _ATTRIBUTE, training)


def _trainer_fit(original: Callable[..., None], trainer: Any, *args: Any, **kwargs: Any) -> None:
    training: JobTraining | None = getattr(trainer, _ATTRIBUTE, None)
    if training is None or building_in_fit():
        original(trainer, *args, **kwargs)
        return
    call = inspect.signature(original).bind(trainer, *args, **kwargs)
    call.apply_defaults()
    arguments = call.arguments
    namespace = trainer_namespace(
        trainer, [("model", arguments.get("model")), ("datamodule", arguments.get("datamodule"))]
    )
    resume = None
    # an app that passes a checkpoint, or set trainer.ckpt_path, has the last word
    chosen = arguments.get("ckpt_path") or (
        trainer.ckpt_path
        if getattr(trainer._checkpoint_connector, "_user_managed", False)
        else None
    )
    if chosen is None:
        resume = training.resume_from(trainer)
        if resume is not None:
            arguments["ckpt_path"] = str(resume.path)
            if "weights_only" in arguments:  # furcate's files hold the RNG states too
                arguments["weights_only"] = False
    fused = None
    group = GroupEnv.from_environ()
    if group is not None:  # the rendezvous, under the preemption watch
        with training.fitting(trainer, namespace):
            resumes = resume is not None or bool(chosen)
            fused = fit_in_group(group, original, trainer, training, arguments, resumes)
    if fused is not None:
        _say_once(trainer, namespace, training, f"training in a fused group of {len(fused.group)}")
        training.checkpoint.save(trainer)  # its end, as its run's last checkpoint
        training.finish(trainer)
        return
    with alone_in_group(group, training) as kept:
        if kept is not None and not chosen:  # its group's leader was gone after some epochs
            resume = training.resume_from(trainer)
            if resume is not None:
                arguments["ckpt_path"] = str(resume.path)
                if "weights_only" in arguments:
                    arguments["weights_only"] = False
        _say_once(trainer, namespace, training, _start_words(resume, chosen))
        with training.fitting(trainer, namespace), _resumed_dir_not_empty(resume):
            original(*call.args, **call.kwargs)
    training.finish(trainer)


@contextmanager
def _resumed_dir_not_empty(resume: ResumePoint | None) -> Iterator[None]:
    """A job resumed in its own job dir finds its checkpoints there: Lightning's warning that
    the checkpoint dir is not empty says nothing then."""
    with warnings.catch_warnings():
        if resume is not None:
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* not empty")
        yield


def _start_words(resume: ResumePoint | None, chosen: Any) -> str:
    if chosen is not None:
        return f"the start the app chose (ckpt_path={str(chosen)!r})"
    if resume is None:
        return "a fresh start (no checkpoint of this run yet)"
    where = "" if resume.at is None else " (epoch {}, batch {})".format(*resume.at)
    whose = ", the app's own last.ckpt" if resume.by_app else ""
    return f"resume from {resume.path}{where}{whose}"


def _say_once(trainer: Any, namespace: Namespace, training: JobTraining, start: str) -> None:
    global _said_in
    if _said_in == os.getpid():
        return
    _said_in = os.getpid()
    env = training.env
    every = [f"every {env.checkpoint_every_n_steps} steps"] if env.checkpoint_every_n_steps else []
    every += [f"every {env.checkpoint_every_s:g} s"] if env.checkpoint_every_s else []
    parts = [
        start,
        f"checkpoints in {env.checkpoint_dir} ({', '.join(['each epoch', *every])}, and at "
        "SIGTERM/SIGUSR1)",
        "history.json, plots/, progress",
    ]
    if env.recording:
        parts.append(f"metrics into MLflow run {env.run_id} ({_logger_words(trainer)})")
    if training.pruning.active:
        parts.append(f"Optuna pruning on {training.pruning.monitor!r}")
    log.info(
        "furcate: the app's %s Trainer gets %s. Turn it off with hydra.launcher.lightning=off.",
        namespace,
        "; ".join(parts),
    )


def _logger_words(trainer: Any) -> str:
    loggers = list(trainer.loggers)
    added = [lg for lg in loggers if getattr(lg, _ADDED, False)]
    apps = [lg for lg in loggers if isinstance(lg, RunBinding) and lg not in added]
    if apps:
        replaced = getattr(apps[0], "_furcate_replaced", {})
        unused = ", ".join(f"{key}={value!r}" for key, value in replaced.items())
        return "the app's MLFlowLogger, bound to it" + (
            f"; its {unused} not used" if unused else ""
        )
    others = ", ".join(type(lg).__name__ for lg in loggers if lg not in added)
    return "an MLFlowLogger added" + (f" beside {others}" if others else "")


# -- MLflow loggers ------------------------------------------------------------------------


def _logger_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    # every MLFlowLogger the job makes is bound: its class with RunBinding in front
    return object.__new__(cls if issubclass(cls, RunBinding) else bound_class(cls))


def _logger_init(
    env: JobEnv | None, original: Callable[..., None], logger: Any, *args: Any, **kwargs: Any
) -> None:
    if env is None:  # the app's own logger, bound to nothing: only its client is this rank's
        with client_for_this_rank():
            original(logger, *args, **kwargs)
        return
    call = inspect.signature(original).bind(logger, *args, **kwargs)
    job = job_arguments(env)
    # what the app set that binding replaces, for the job's one line
    replaced = {
        key: value
        for key, value in call.arguments.items()
        if key in ("tracking_uri", "run_id", "experiment_name", "run_name")
        and value is not None
        and value != job.get(key)
    }
    call.arguments.update(job)
    with client_for_this_rank():
        original(*call.args, **call.kwargs)
    logger._furcate_replaced = replaced
