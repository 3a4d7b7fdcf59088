"""Translate Hydra's launcher calls into slot-pool calls, and pool results into JobReturns.

launch(overrides...) ──► compose each job's config here (load_sweep_config, job num/id)
                    ──► SlotPool.submit(payload = pickled config) ──► forked job: run_job
                    ◄── JobResult ──► JobReturn (COMPLETED / FAILED with a typed error)
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
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides
from hydra.errors import CompactHydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from furcate_hydra.errors import FurcateConfigError, JobCrashedError
from furcate_hydra.pool import JobResult, JobSpec, JobState, PoolOptions, SlotPool
from furcate_hydra.slots import SlotOptions, plan_slots
from hydra_plugins.furcate_launcher._job import HydraJobContext, JobOutcome, RemoteTraceback

log = logging.getLogger(__name__)

__all__ = ["LaunchSession", "LauncherOptionError", "launch", "pool_options"]


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
        except FurcateConfigError as exc:
            raise LauncherOptionError(exc.key, exc.value, exc.problem, exc.fix) from None
        log.info("furcate: %s", self.plan.describe())
        self._context = self._context_blob()
        self.pool = SlotPool(self.plan, self._context, pool_opts)
        self._configs: dict[str, DictConfig] = {}

    def refresh_context(self) -> None:
        """Ship the singleton state to the fork server again if it changed (new resolvers)."""
        context = self._context_blob()
        if context != self._context:
            self._context = context
            self.pool.set_context(context)

    def submit(self, overrides: Sequence[str], job_num: int) -> str:
        sweep_config = self.hydra_context.config_loader.load_sweep_config(
            self.config, list(overrides)
        )
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = job_num
            sweep_config.hydra.job.num = job_num
        output_dir = _output_dir(sweep_config)
        key = str(job_num)
        self._configs[key] = sweep_config
        label = " ".join(filter_overrides(overrides))
        log.info("\t#%d : %s", job_num, label)
        self.pool.submit(JobSpec(key, pickle.dumps(sweep_config), output_dir, label))
        return key

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        return [(r.spec.key, self._to_job_return(r)) for r in self.pool.wait_any(timeout)]

    def close(self) -> None:
        self.pool.close()

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
        return _failed_job_return(sweep_config, result)


def launch(
    session: LaunchSession, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Hydra's ``Launcher.launch``: submit every job, return JobReturns in input order."""
    configure_log(session.config.hydra.hydra_logging, session.config.hydra.verbose)
    Path(str(session.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    log.info("Launching %d jobs on %d slots", len(job_overrides), len(session.plan.slots))
    session.refresh_context()
    with stop_pool_on_interrupt(session):
        keys = [
            session.submit(overrides, initial_job_idx + i)
            for i, overrides in enumerate(job_overrides)
        ]
        returns: dict[str, JobReturn] = {}
        while len(returns) < len(keys):
            returns.update(session.wait_any())
    return [returns[key] for key in keys]


@contextmanager
def stop_pool_on_interrupt(session: LaunchSession) -> Iterator[None]:
    """On Ctrl-C or SIGTERM, stop every job's process group before the launcher goes."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        yield
    except BaseException:
        session.close()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
    grace = options.get("stop_grace_s", 5.0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace <= 0:
        raise FurcateConfigError(
            "hydra.launcher.stop_grace_s",
            grace,
            "must be a positive number of seconds",
            "set hydra.launcher.stop_grace_s=5",
        )
    preload = options.get("preload") or []
    if isinstance(preload, str) or not all(isinstance(name, str) and name for name in preload):
        raise FurcateConfigError(
            "hydra.launcher.preload",
            preload,
            "must be a list of module names",
            "set hydra.launcher.preload=[torch,pytorch_lightning] (or [] to preload nothing)",
        )
    return PoolOptions(
        max_retries=max_retries,
        preload=tuple(preload),
        echo_output=bool(options.get("echo_output", True)),
        stop_grace_s=float(grace),
    )


def _output_dir(sweep_config: DictConfig) -> Path:
    # The same rule run_job applies in the job, evaluated here so the pool knows where the
    # job's logs go even if the job dies before Hydra creates its directory.
    hydra_config = HydraConfig.instance()
    launcher_cfg = hydra_config.cfg
    hydra_config.set_config(sweep_config)
    try:
        sweep_dir = str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))
        subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    finally:
        hydra_config.cfg = launcher_cfg  # the launcher's own view stays its own
    return Path(os.path.abspath(os.path.join(sweep_dir, subdir)))


def _failed_job_return(sweep_config: DictConfig, result: JobResult) -> JobReturn:
    task_cfg = OmegaConf.masked_copy(sweep_config, [str(k) for k in sweep_config if k != "hydra"])
    overrides = OmegaConf.to_container(sweep_config.hydra.overrides.task)
    hydra_cfg = OmegaConf.create({"hydra": sweep_config.hydra})
    output_dir = str(result.spec.log_dir)
    runtime = hydra_cfg.hydra.runtime
    with read_write(runtime), open_dict(runtime):
        # What run_job would have recorded had the job lived long enough.
        runtime.output_dir = output_dir
    job_return = JobReturn(
        overrides=list(overrides) if isinstance(overrides, list) else [],
        cfg=task_cfg,
        hydra_cfg=hydra_cfg,
        working_dir=output_dir if sweep_config.hydra.job.chdir else os.getcwd(),
        task_name=str(sweep_config.hydra.job.name),
        status=JobStatus.FAILED,
    )
    job_return.return_value = JobCrashedError(
        f"Job #{result.spec.key} ({result.spec.label or 'no overrides'}) {result.state.value}: "
        f"{result.error}"
    )
    return job_return
