"""The Hydra side of a job: what the fork server holds warm and what each forked job runs."""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from furcate_hydra import env_vars
from furcate_hydra.hydra_api.private_names import Callbacks, returned
from furcate_hydra.job_process.lightning_auto import install_for_job
from furcate_hydra.job_process.rank_processes import prepare_for_ranks
from furcate_hydra.job_process.warm_ranks import route_ranks
from furcate_hydra.store import (
    build_store_for_forks,
    load_run_for_forks,
    set_aside_inherited_connections,
)

__all__ = [
    "HydraJobContext",
    "JobOutcome",
    "RemoteTraceback",
    "context_blob",
    "fork_context",
    "job_payload",
]


# what a job records into its own MLflow run with (its Trainer's metrics, checkpoints, plots)
LIGHTNING_LAYER = "furcate_hydra.lightning"


class RemoteTraceback(Exception):
    """The traceback of an exception raised inside a job's process, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nTraceback from the job's process:\n{self.text}"


def job_payload(sweep_config: Any) -> bytes:
    """What one job's process unpickles: its composed config. Its environment (run, dirs,
    trial) travels in the job's record and is set by the executor before the job starts."""
    return pickle.dumps(sweep_config)


@dataclass
class JobOutcome:
    """A job's JobReturn plus, when it failed, its traceback as text (exceptions lose theirs)."""

    job_return: JobReturn
    traceback: str | None = None

    @property
    def failure(self) -> str | None:
        """The task's traceback when it failed (the executor reads it, e.g. for a CUDA
        out-of-memory)."""
        return self.traceback


class HydraJobContext:
    """Task function, Hydra context and singleton state: shipped once, kept warm in the server."""

    def __init__(
        self,
        task_function: TaskFunction,
        hydra_context: HydraContext,
        singleton_state: Any,
        tracking_uri: str | None = None,
    ) -> None:
        """``singleton_state``: Hydra's, as ``Singleton.get_state()`` took it; None for a
        fork of the launcher, which has the launcher's state as it is at the fork.
        ``tracking_uri``: the sweep's MLflow store, built once in the server for every job."""
        self.task_function = task_function
        self.hydra_context = hydra_context
        self.singleton_state = singleton_state
        self.tracking_uri = tracking_uri
        self._warm_uri: str | None = None  # the store the server warms for its jobs (prepare)
        self._runs_loaded = False

    def prepare(self) -> None:
        # Done once in the server so every forked job inherits the resolvers and singletons.
        if self.singleton_state is None:  # a fork of the launcher: its connections stay its own
            set_aside_inherited_connections()
        setup_globals()
        if self.singleton_state is not None:
            Singleton.set_state(self.singleton_state)
        self.after_imports()

    def after_imports(self) -> None:
        # Only jobs that record into their run themselves (furcate's Lightning layer, loaded
        # here for an app that imports Lightning, now or once its jobs were seen to) open the
        # store: for others it is wasted
        if self._warm_uri is None and LIGHTNING_LAYER in sys.modules:
            self._warm_uri = self.tracking_uri
            if self._warm_uri is not None:
                build_store_for_forks(self._warm_uri)

    def before_fork(self, env: Mapping[str, str]) -> None:
        # once, the first job's run: every later job inherits what loading a run sets up
        run_id = env.get(env_vars.RUN_ID)
        if self._runs_loaded or self._warm_uri is None or run_id is None:
            return
        self._runs_loaded = True
        load_run_for_forks(self._warm_uri, run_id)

    def run(self, payload: bytes, gate: Callable[[], None]) -> JobOutcome:
        # Hydra's set-up (job dir, .hydra/*.yaml, job logging, env_set) comes before the gate:
        # a job forked ahead of its slot has done it by the time the slot frees
        callbacks = _GatedCallbacks(self.hydra_context.callbacks, gate)
        job_return = run_job(
            hydra_context=dataclasses.replace(self.hydra_context, callbacks=callbacks),
            task_function=self.task_function,
            config=pickle.loads(payload),
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        if job_return.status != JobStatus.FAILED:
            return JobOutcome(job_return)
        error = returned(job_return)
        text = "".join(traceback.format_exception(error))
        # Also into the job's stderr.log, next to whatever the job printed before failing.
        print(text, file=sys.stderr, flush=True)
        if not _picklable(error):
            job_return.return_value = RuntimeError(f"{type(error).__qualname__}: {error}")
        return JobOutcome(job_return, text)


class _GatedCallbacks(Callbacks):
    """The app's Hydra callbacks, with the gate passed right before ``on_job_start``: the
    last step before the task, after Hydra's set-up."""

    def __init__(self, callbacks: Callbacks, gate: Callable[[], None]) -> None:
        super().__init__()
        self.callbacks = callbacks.callbacks
        self._gate = gate

    def on_job_start(
        self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any
    ) -> None:
        self._gate()
        # the slot's variables are in place now; hydra.job.env_set still has the last word
        os.environ.update({str(k): str(v) for k, v in config.hydra.job.env_set.items()})
        # hydra.launcher.lightning=auto: a Trainer the task builds gets what fit gives, and
        # the ranks of its DDP launcher are forks of this process
        install_for_job(route_ranks)
        # Lightning's DDP subprocess launcher re-runs the script: for this job, not the sweep
        prepare_for_ranks(config)
        super().on_job_start(config, task_function=task_function, **kwargs)


def _picklable(value: object) -> bool:
    try:
        pickle.loads(cloudpickle.dumps(value))
    except Exception:
        return False
    return True


def fork_context(
    task_function: TaskFunction, hydra_context: HydraContext, tracking_uri: str | None
) -> HydraJobContext | None:
    """What the fork server starts jobs from if it is a fork of this process, asked as it
    starts. A fork has Hydra's singletons as they are then, and sets aside the database
    connections this process has open (an earlier launch here, a value read back by a
    sweeper), which its jobs must not share (``prepare``)."""
    return HydraJobContext(task_function, hydra_context, None, tracking_uri)


def context_blob(
    task_function: TaskFunction, hydra_context: HydraContext, tracking_uri: str | None
) -> bytes:
    """What every job's process is started with: the task, Hydra's singletons and the sweep's
    MLflow store, pickled."""
    context = HydraJobContext(task_function, hydra_context, Singleton.get_state(), tracking_uri)
    return bytes(cloudpickle.dumps(context))
