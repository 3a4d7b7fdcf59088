"""A job decided not to run: its result from the record, its job dir, its row.

SKIP            ──► the config FINISHED before (here or in another launcher): a completed
                    JobReturn with the recorded return value
REPORT_FAILURE  ──► it FAILED before and ``rerun=none``, or it failed in another launcher:
                    a failed JobReturn saying where
Either way the job dir gets Hydra's ``.hydra/`` files and a run_data.json that names the run
it was taken from, and run_data.csv gets its row.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.execution.job import Job
from furcate_hydra.records.after_run import OutcomeRecorder
from furcate_hydra.records.job_returns import synthetic_job_return
from furcate_hydra.store import Action, Decision, RunStatus, Tags
from furcate_hydra.store.access import StoreAccess
from furcate_hydra.store.run_data import JobRow, write_run_data_json

__all__ = ["not_run"]


def not_run(
    job: Job, decision: Decision, access: StoreAccess | None, outcomes: OutcomeRecorder
) -> JobReturn | None:
    """The JobReturn of a job that does not run (its record says how it ended), recorded in
    ``outcomes`` and in its job dir; None for a job that runs."""
    record = decision.record
    if decision.action is Action.SKIP and record is not None and access is not None:
        value = access.recorded_return_value(record)
        recorded = Path(record.output_dir) if record.output_dir else None
        # the recorded run's dir holds what the task wrote; once deleted, the new job dir
        # (its .hydra/ files, its log, a run_data.json naming the run) stands in for it
        shown = recorded if recorded is not None and recorded.is_dir() else None
        job.run_id, job.skipped = record.run_id, True
        row = outcomes.add_row(job, RunStatus.FINISHED, value, None, metrics_pending=True)
        job_return = synthetic_job_return(
            job.config, shown or job.paths.output_dir, JobStatus.COMPLETED, value
        )
        _write_job_dir(job, row, job_return, recorded, decision)
        return job_return
    if decision.action is Action.REPORT_FAILURE and record is not None:
        if decision.ran_elsewhere:
            why = record.tags.get(Tags.ERROR, "no error recorded").splitlines()[-1:] or [""]
            error = RuntimeError(
                f"Job {job.name} failed in another launcher, in MLflow run "
                f"{record.run_id}: {why[0]}"
            )
        else:
            error = RuntimeError(
                f"Job {job.name} is {decision.reason} in MLflow run {record.run_id} and "
                "hydra.launcher.rerun=none; set hydra.launcher.rerun=failed to run it again"
            )
        job.run_id, job.skipped = record.run_id, True
        row = outcomes.add_row(job, record.status, None, str(error))
        job_return = synthetic_job_return(job.config, job.paths.output_dir, JobStatus.FAILED, error)
        ran_in = Path(record.output_dir) if record.output_dir else None
        _write_job_dir(job, row, job_return, ran_in, decision)
        return job_return
    return None


def _write_job_dir(
    job: Job, row: JobRow, job_return: JobReturn, recorded: Path | None, decision: Decision
) -> None:
    """A job that did not run still gets its dir: Hydra's ``.hydra/`` files, as run_job
    writes them, and a ``run_data.json`` that names the run it was taken from."""
    output_dir = job.paths.output_dir
    subdir = job.config.hydra.output_subdir
    if subdir is not None:
        hydra_dir = output_dir / str(subdir)
        hydra_dir.mkdir(parents=True, exist_ok=True)
        for name, node in (
            ("config.yaml", job_return.cfg),
            ("hydra.yaml", job_return.hydra_cfg),
            ("overrides.yaml", job.config.hydra.overrides.task),
        ):
            text = OmegaConf.to_yaml(node).encode()
            atomic_write_bytes(hydra_dir / name, text, durable=False)
    output_dir.mkdir(parents=True, exist_ok=True)
    details = {
        "recorded_output_dir": None if recorded is None else str(recorded),
        "ran_elsewhere": decision.ran_elsewhere,
    }
    write_run_data_json(job.paths.run_data, row, job.task_config, details)
    if "file" in (job.config.hydra.job_logging or {}).get("handlers", {}):
        # Hydra's job logging writes <job name>.log in every job dir that ran
        when = "in another launcher" if decision.ran_elsewhere else "before"
        why = row.error or f"skipped: finished {when} in MLflow run {job.run_id}"
        where = "" if recorded is None else f" (its outputs: {recorded})"
        log_file = output_dir / f"{job.config.hydra.job.name}.log"
        atomic_write_bytes(log_file, f"furcate: {why}{where}\n".encode(), durable=False)
