"""JobReturns: a job's own, or one built for a job that did not run to a report (skipped,
crashed or stopped); and how a job that did not finish ended, in words."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from furcate_hydra.errors import JobCrashedError
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.hydra_api.private_names import returned
from furcate_hydra.job_process.job_context import JobOutcome, RemoteTraceback

__all__ = ["error_text", "how_it_ended", "synthetic_job_return", "to_job_return"]


def to_job_return(job: Job) -> JobReturn:
    """The JobReturn of a job the executor handed back: the task's own, its error's remote
    traceback attached; else one built for a job that crashed, was stopped or lost."""
    if job.state is JobState.COMPLETED and isinstance(job.value, JobOutcome):
        job_return = job.value.job_return
        if job.value.traceback is not None:
            error = returned(job_return)
            logs = f"\n{job.paths.see_logs()}"
            error.__cause__ = RemoteTraceback(job.value.traceback + logs)
        return job_return
    error = JobCrashedError(f"Job {job.name} {job.state.value}: {job.error}")
    return synthetic_job_return(job.config, job.paths.output_dir, JobStatus.FAILED, error)


def error_text(job: Job, job_return: JobReturn) -> str:
    """Why a job did not finish, in words."""
    if job.state is JobState.COMPLETED:  # the task raised: the exception says why
        error = returned(job_return)
        return f"{type(error).__name__}: {error}"
    return job.error or job.state.value


def how_it_ended(job: Job, text: str) -> str:
    """How a job that did not finish ended: failed, crashed, killed, preempted, not started."""
    if job.state is JobState.CANCELLED:
        return "killed" if job.started_at is not None else "not started"
    if job.state is JobState.CRASHED:  # killed from outside, or died of a signal
        return "killed" if re.search(r"by SIG(KILL|TERM)\b", text) else "crashed"
    if job.state is JobState.PREEMPTED:  # more often than it may be queued again
        return "preempted"
    return "failed"


def synthetic_job_return(
    sweep_config: DictConfig, output_dir: Path, status: JobStatus, value: Any
) -> JobReturn:
    """What run_job would have returned, built in the launcher without running the task."""
    task_cfg = OmegaConf.masked_copy(sweep_config, [str(k) for k in sweep_config if k != "hydra"])
    overrides = OmegaConf.to_container(sweep_config.hydra.overrides.task)
    hydra_cfg = OmegaConf.create({"hydra": sweep_config.hydra})
    runtime = hydra_cfg.hydra.runtime
    with read_write(runtime), open_dict(runtime):
        runtime.output_dir = str(output_dir)
    job_return = JobReturn(
        overrides=list(overrides) if isinstance(overrides, list) else [],
        cfg=task_cfg,
        hydra_cfg=hydra_cfg,
        working_dir=str(output_dir) if _changes_dir(sweep_config) else os.getcwd(),
        task_name=str(sweep_config.hydra.job.name),
        status=status,
    )
    job_return.return_value = value
    return job_return


def _changes_dir(sweep_config: DictConfig) -> bool:
    # as run_job decides: unset chdir means True for apps on version_base < 1.2
    chdir = sweep_config.hydra.job.chdir
    if chdir is None:
        from hydra import version

        return not version.base_at_least("1.2")
    return bool(chdir)
