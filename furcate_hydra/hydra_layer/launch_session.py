"""Translate Hydra's launcher calls into slot-pool calls, and pool results into JobReturns.

launch(overrides...) ──► compose each job's config here (SweepComposer, job num/id)
                    ──► recorder: fingerprint, one MLflow lookup per chunk ──► skip / resume / run
                    ──► SlotPool.submit(payload = config + job env) ──► forked job: run_job
                    ◄── JobResult ──► JobReturn (COMPLETED / FAILED with a typed error)
                    ──► recorder: run's final status, return value, artifacts, run data
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.errors import CompactHydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from furcate_hydra.errors import (
    FurcateConfigError,
    JobCrashedError,
    name_list,
    positive_seconds,
)
from furcate_hydra.execution.local_pool import JobResult, JobSpec, JobState, PoolOptions, SlotPool
from furcate_hydra.execution.slots import SlotOptions, plan_slots
from furcate_hydra.hydra_layer.compose import SweepComposer
from furcate_hydra.hydra_layer.job_context import (
    HydraJobContext,
    JobOutcome,
    JobPayload,
    RemoteTraceback,
)
from furcate_hydra.hydra_layer.job_returns import synthetic_job_return
from furcate_hydra.hydra_layer.recording import (
    ComposedJob,
    JobRecorder,
    PreparedJob,
    StoreOptions,
)
from furcate_hydra.hydra_layer.task_config import as_job, task_container

log = logging.getLogger(__name__)

# Configs composed and looked up in the store together, after the first slot-filling chunk.
LOOKUP_CHUNK = 64

__all__ = ["LaunchSession", "LauncherOptionError", "launch", "pool_options", "streaming"]


class LauncherOptionError(FurcateConfigError, CompactHydraException):
    """A bad ``hydra.launcher`` option; Hydra prints just the message, not a stack trace."""


class LaunchSession:
    """A slot pool plus the Hydra context: overrides become jobs, results become JobReturns.

    Lives as long as its launcher, so a sweeper calling ``launch`` batch after batch (or using
    ``submit``/``wait_any``) keeps one warm fork server.
    """

    def __init__(
        self,
        options: dict[str, Any],
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        # Validate and plan before anything runs, so bad options cost nothing.
        try:
            self.plan = plan_slots(slot_options(options))
            pool_opts = pool_options(options)
            store_opts = StoreOptions.parse(options)
            # Opens the tracking store now: an unreachable one fails before any job starts.
            self.recorder = JobRecorder(store_opts, config)
        except FurcateConfigError as exc:
            raise LauncherOptionError(exc.key, exc.value, exc.problem, exc.fix) from None
        log.info("furcate: %s", self.plan.describe())
        self._context = self._context_blob()
        self.pool = SlotPool(self.plan, self._context, pool_opts)
        self._configs: dict[str, DictConfig] = {}
        self._ready: list[tuple[str, JobReturn]] = []
        self.composer = SweepComposer(hydra_context, config)
        self.submitted = self.skipped = 0  # through submit/submit_batch, for the log
        self._closed = False

    def refresh_context(self) -> None:
        """Ship the singleton state to the fork server again if it changed (new resolvers)."""
        context = self._context_blob()
        if context != self._context:
            self._context = context
            self.pool.set_context(context)

    def submit(self, overrides: Sequence[str], job_num: int) -> str:
        return self.submit_batch([(overrides, job_num)])[0]

    def submit_batch(self, jobs: Sequence[tuple[Sequence[str], int]]) -> list[str]:
        """Compose, look up (one store query for the batch) and queue jobs; returns their keys.

        Jobs already recorded as FINISHED are not run: their JobReturns, carrying the recorded
        return value, come out of the next ``wait_any``.
        """
        prepared = self.queue(jobs)
        # Summed over a whole stream: a sweeper submitting one job per freed slot would
        # otherwise log a line per job.
        self.submitted += len(prepared)
        self.skipped += sum(1 for item in prepared if item.skipped is not None)
        return [item.job.key for item in prepared]

    def queue(self, jobs: Sequence[tuple[Sequence[str], int]]) -> list[PreparedJob]:
        composed = [self._compose(overrides, job_num) for overrides, job_num in jobs]
        prepared = self.recorder.prepare(composed)
        for item in prepared:
            # Each job is handed to the pool as soon as its run exists, not after the batch.
            self.recorder.open(item)
            job = item.job
            if item.skipped is not None:
                log.info("\t#%d : %s (skipped: run %s)", job.job_num, job.label, item.run_id)
                self._ready.append((job.key, item.skipped))
                continue
            log.info("\t#%d : %s", job.job_num, job.label)
            self._configs[job.key] = job.sweep_config
            payload = pickle.dumps(JobPayload(job.sweep_config, item.env))
            self.pool.submit(JobSpec(job.key, payload, job.output_dir, job.label))
        return prepared

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        if self._ready:
            ready, self._ready = self._ready, []
            return ready + [(r.spec.key, self._finish(r)) for r in self.pool.wait_any(0)]
        returns = [(r.spec.key, self._finish(r)) for r in self.pool.wait_any(timeout)]
        self.recorder.flush(force=False)
        return returns

    @property
    def pending(self) -> int:
        return self.pool.pending + len(self._ready)

    def close(self, interrupted: bool = False) -> None:
        """Stop the pool; record jobs still running as KILLED and the sweep's final state."""
        if self._closed:
            return
        self._closed = True
        self.pool.close()
        self.recorder.close(interrupted)

    def _compose(self, overrides: Sequence[str], job_num: int) -> ComposedJob:
        sweep_config = self.composer.compose(overrides)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = job_num
            sweep_config.hydra.job.num = job_num
        label = " ".join(task_overrides(overrides))
        with as_job(sweep_config):
            output_dir = _output_dir(sweep_config)
            task = task_container(sweep_config)
        return ComposedJob(
            str(job_num), job_num, list(overrides), label, sweep_config, output_dir, task
        )

    def _finish(self, result: JobResult) -> JobReturn:
        job_return = self._to_job_return(result)
        self.recorder.record(result.spec.key, result, job_return)
        return job_return

    def _context_blob(self) -> bytes:
        context = HydraJobContext(self.task_function, self.hydra_context, Singleton.get_state())
        return bytes(cloudpickle.dumps(context))

    def _to_job_return(self, result: JobResult) -> JobReturn:
        sweep_config = self._configs.pop(result.spec.key)
        if result.state is JobState.COMPLETED and isinstance(result.value, JobOutcome):
            job_return = result.value.job_return
            if result.value.traceback is not None:
                error = job_return._return_value
                logs = f"\nSee the job's logs: {result.stdout_path} and {result.stderr_path}"
                error.__cause__ = RemoteTraceback(result.value.traceback + logs)
            return job_return
        error = JobCrashedError(
            f"Job #{result.spec.key} ({result.spec.label or 'no overrides'}) {result.state.value}: "
            f"{result.error}"
        )
        return synthetic_job_return(sweep_config, result.spec.log_dir, JobStatus.FAILED, error)


def launch(
    session: LaunchSession, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Hydra's ``Launcher.launch``: submit every job, return JobReturns in input order."""
    numbered = [(overrides, initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
    with streaming(session):
        log.info("Launching %d jobs on %d slots", len(job_overrides), len(session.plan.slots))
        prepared: list[PreparedJob] = []
        returns: dict[str, JobReturn] = {}
        # The first chunk fills the idle slots at once; later ones are composed and looked
        # up while those jobs run.
        chunk = max(session.pool.idle_slots, 1)
        while numbered:
            prepared += session.queue(numbered[:chunk])
            numbered = numbered[chunk:]
            chunk = LOOKUP_CHUNK
            returns.update(session.wait_any(timeout=0))
        if summary := session.recorder.summary(prepared):
            log.info("furcate: %s", summary)
        while len(returns) < len(prepared):
            returns.update(session.wait_any())
    return [returns[item.job.key] for item in prepared]


@contextmanager
def streaming(session: LaunchSession) -> Iterator[None]:
    """Around a run of submits and waits: Hydra's logging and sweep dir set up first; on Ctrl-C
    or SIGTERM every job's process group is stopped before the launcher goes; the sweep's run
    data is written when it ends."""
    configure_log(session.config.hydra.hydra_logging, session.config.hydra.verbose)
    Path(str(session.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    session.refresh_context()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    session.submitted = session.skipped = 0
    try:
        yield
        session.recorder.flush()
        if session.skipped:
            log.info(
                "furcate: skipped %d of %d configs already recorded in MLflow",
                session.skipped,
                session.submitted,
            )
    except BaseException:
        session.close(interrupted=True)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def task_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides of the task's config: Hydra's ``filter_overrides`` misses ``+hydra.*`` and
    ``++hydra.*`` (the Optuna sweeper passes each trial's environment that way)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


def slot_options(options: dict[str, Any]) -> SlotOptions:
    gpus = options.get("gpus")
    if isinstance(gpus, ListConfig | tuple):
        gpus = list(gpus)  # the slot planner validates the entries and says what is wrong
    return SlotOptions(
        gpus=gpus,
        jobs_per_gpu=options.get("jobs_per_gpu"),
        gpu_mem_per_job_gb=options.get("gpu_mem_per_job_gb"),
        max_jobs_per_gpu=options.get("max_jobs_per_gpu", 8),
        max_workers=options.get("max_workers"),
        cpus_per_job=options.get("cpus_per_job"),
        allow_cpu=options.get("allow_cpu", True),
    )


def pool_options(options: dict[str, Any]) -> PoolOptions:
    max_retries = options.get("max_retries", 0)
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise FurcateConfigError(
            "hydra.launcher.max_retries",
            max_retries,
            "must be a whole number of retries, 0 or more",
            "set hydra.launcher.max_retries=0 (no retries) or a positive count such as 2",
        )
    grace = positive_seconds("hydra.launcher.stop_grace_s", options.get("stop_grace_s", 5.0), 5)
    preload = name_list(
        "hydra.launcher.preload",
        options.get("preload"),
        "module names",
        "hydra.launcher.preload=[torch,pytorch_lightning] (or [] to preload nothing)",
    )
    return PoolOptions(
        max_retries=max_retries,
        preload=preload,
        echo_output=bool(options.get("echo_output", True)),
        stop_grace_s=grace,
    )


def _output_dir(sweep_config: DictConfig) -> Path:
    # The same rule run_job applies in the job (call inside as_job), evaluated here so the
    # pool knows where the job's logs go even if the job dies before Hydra creates its dir.
    sweep_dir = str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    return Path(os.path.abspath(os.path.join(sweep_dir, subdir)))
