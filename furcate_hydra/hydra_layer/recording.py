"""Every job an MLflow run: decide skip/resume/run per batch, record outcomes, write run data.

prepare(jobs) ──► fingerprints ──► one store lookup ──► per job:
                    FINISHED before   → JobReturn from the record, not run
                    interrupted/KILLED → same run again, resumes from its checkpoint dir
                    otherwise          → new RUNNING run (tags, params)
record(job, result, JobReturn) ──► FINISHED / FAILED / KILLED, return value, artifacts,
                                   run_data.json; a row for run_data.csv
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from furcate_hydra import env_vars
from furcate_hydra.errors import name_list, positive_seconds
from furcate_hydra.execution.local_pool import JobResult, JobState
from furcate_hydra.hydra_layer.job_returns import synthetic_job_return
from furcate_hydra.store import (
    Action,
    Decision,
    Rerun,
    RunStatus,
    RunStore,
    Tags,
    flatten_params,
    resolve_tracking_uri,
)
from furcate_hydra.store.fingerprint import fingerprint
from furcate_hydra.store.run_data import (
    RUN_DATA_CSV,
    RUN_DATA_JSON,
    JobRow,
    write_run_data_csv,
    write_run_data_json,
)

log = logging.getLogger(__name__)

__all__ = ["ComposedJob", "JobRecorder", "PreparedJob", "StoreOptions"]

CHECKPOINTS = "checkpoints"
# run_data.csv is rewritten at most this often while jobs stream in, and at every batch's end.
_CSV_EVERY_S = 10.0


@dataclass(frozen=True)
class StoreOptions:
    enabled: bool
    tracking_uri: str | None
    experiment_name: str | None
    heartbeat_s: float
    stale_after_s: float
    sqlite_wal: bool
    rerun: Rerun
    fingerprint_ignore: tuple[str, ...]

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> StoreOptions:
        mlflow = dict(options.get("mlflow") or {})
        ignore = name_list(
            "hydra.launcher.fingerprint_ignore",
            options.get("fingerprint_ignore"),
            "dotted config keys",
            "hydra.launcher.fingerprint_ignore=[data_dir,num_workers]",
        )
        return cls(
            enabled=bool(mlflow.get("enabled", True)),
            tracking_uri=mlflow.get("tracking_uri") or None,
            experiment_name=mlflow.get("experiment_name") or None,
            heartbeat_s=_positive(mlflow, "heartbeat_s", 10.0),
            stale_after_s=_positive(mlflow, "stale_after_s", 60.0),
            sqlite_wal=bool(mlflow.get("sqlite_wal", True)),
            rerun=Rerun.parse(options.get("rerun", "failed")),
            fingerprint_ignore=ignore,
        )


@dataclass
class ComposedJob:
    key: str
    job_num: int
    overrides: list[str]
    label: str
    sweep_config: DictConfig
    output_dir: Path
    task_config: dict[str, Any]  # resolved, as plain values (see _task_config)


@dataclass
class PreparedJob:
    job: ComposedJob
    fingerprint: str
    decision: Decision
    env: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    resumed: bool = False
    skipped: JobReturn | None = None  # set when the job is not run
    started: float = field(default_factory=time.time)


class JobRecorder:
    """The launcher's side of the store; without MLflow it still fingerprints and writes files."""

    def __init__(self, options: StoreOptions, launcher_config: DictConfig) -> None:
        self.options = options
        self.sweep_dir = Path(os.path.abspath(str(launcher_config.hydra.sweep.dir)))
        self._invocation = " ".join(launcher_config.hydra.overrides.task)
        self.store: RunStore | None = None
        if options.enabled:
            tracking = resolve_tracking_uri(options.tracking_uri)
            experiment = options.experiment_name or str(launcher_config.hydra.job.name)
            self.store = RunStore(
                tracking,
                experiment,
                options.heartbeat_s,
                options.stale_after_s,
                sqlite_wal=options.sqlite_wal,
            )
            log.info("furcate: recording runs in %s (experiment %r)", tracking.uri, experiment)
        self._rows: dict[str, JobRow] = {}
        self._metrics_pending: set[str] = set()
        self._in_flight: dict[str, PreparedJob] = {}
        self._csv_written = 0.0

    # -- before jobs run ----------------------------------------------------------------

    def prepare(self, jobs: Sequence[ComposedJob]) -> list[PreparedJob]:
        """Fingerprint a batch and decide each job with one store lookup for all of them."""
        fingerprints = [
            fingerprint(job.task_config, self.options.fingerprint_ignore) for job in jobs
        ]
        decisions: dict[str, Decision] = {}
        if self.store is not None:
            self._ensure_sweep_run()
            decisions = self.store.decide(set(fingerprints), self.options.rerun)
        run = Decision(Action.RUN)
        return [
            PreparedJob(job, fp, decisions.get(fp, run))
            for job, fp in zip(jobs, fingerprints, strict=True)
        ]

    def open(self, item: PreparedJob) -> None:
        """Skip the job (``item.skipped`` set) or open its run: a new one or the interrupted one."""
        job, decision = item.job, item.decision
        record = decision.record
        checkpoint_dir = job.output_dir / CHECKPOINTS
        if decision.action is Action.SKIP and record is not None and self.store is not None:
            value = self.store.recorded_return_value(record)
            output_dir = Path(record.output_dir or job.output_dir)
            item.skipped = synthetic_job_return(
                job.sweep_config, output_dir, JobStatus.COMPLETED, value
            )
            item.run_id = record.run_id
            self._add_row(item, RunStatus.FINISHED, value, None, skipped=True)
            return
        if decision.action is Action.REPORT_FAILURE and record is not None:
            error = RuntimeError(
                f"Job #{job.job_num} ({job.label or 'no overrides'}) is {decision.reason} in "
                f"MLflow run {record.run_id} and hydra.launcher.rerun=none; set "
                "hydra.launcher.rerun=failed to run it again"
            )
            item.skipped = synthetic_job_return(
                job.sweep_config, job.output_dir, JobStatus.FAILED, error
            )
            item.run_id = record.run_id
            self._add_row(item, record.status, None, str(error), skipped=True)
            return
        if self.store is not None:
            resumed = record if decision.action is Action.RESUME else None
            if resumed is not None and resumed.checkpoint_dir:
                checkpoint_dir = Path(resumed.checkpoint_dir)  # the run keeps its checkpoints
            tags = {**self._job_tags(item), Tags.CHECKPOINT_DIR: str(checkpoint_dir)}
            if resumed is not None:
                item.run_id = self.store.reopen_job_run(resumed, tags)
                item.resumed = True
                log.info(
                    "\t#%d resumes MLflow run %s (%s)", job.job_num, resumed.run_id, decision.reason
                )
            else:
                name = (job.label or "defaults")[:240]
                params = flatten_params(job.task_config)
                item.run_id = self.store.create_job_run(name, tags, params)
            item.env.update(
                {
                    env_vars.TRACKING_URI: self.store.tracking_uri,
                    env_vars.RUN_ID: item.run_id,
                    env_vars.EXPERIMENT_ID: self.store.experiment_id,
                }
            )
        item.env[env_vars.OUTPUT_DIR] = str(job.output_dir)
        item.env[env_vars.CHECKPOINT_DIR] = str(checkpoint_dir)
        self._in_flight[job.key] = item

    def _job_tags(self, item: PreparedJob) -> dict[str, str]:
        return {
            Tags.FINGERPRINT: item.fingerprint,
            Tags.OVERRIDES: " ".join(item.job.overrides),
            Tags.JOB_NUM: str(item.job.job_num),
            Tags.OUTPUT_DIR: str(item.job.output_dir),
        }

    def _ensure_sweep_run(self) -> None:
        assert self.store is not None
        if self.store.sweep_run_id is None:
            name = f"sweep {self.sweep_dir.parent.name}/{self.sweep_dir.name}"
            self.store.start_sweep(
                name, {Tags.SWEEP_DIR: str(self.sweep_dir), Tags.OVERRIDES: self._invocation}
            )

    # -- after a job ends ---------------------------------------------------------------

    def record(self, key: str, result: JobResult, job_return: JobReturn) -> None:
        item = self._in_flight.pop(key, None)
        if item is None:
            return
        status, value, error = _outcome(result, job_return)
        row = self._add_row(item, status, value, error, skipped=False, result=result)
        output_dir = item.job.output_dir
        write_run_data_json(output_dir / RUN_DATA_JSON, row, item.job.task_config, _details(result))
        if self.store is not None and item.run_id is not None:
            artifacts = [result.stdout_path, result.stderr_path, output_dir / RUN_DATA_JSON]
            self.store.finish_job_run(
                item.run_id,
                status,
                return_value=value,
                error=error,
                artifacts=artifacts,
                end_time=result.ended_at,
            )
            self._metrics_pending.add(item.run_id)

    def job_run(self, key: str) -> tuple[str | None, bool]:
        """A submitted job's MLflow run (None when not recording) and whether the job was
        skipped, its return read from that recorded run."""
        row = self._rows.get(key)
        return (row.run_id, row.skipped) if row is not None else (None, False)

    @property
    def tracking_uri(self) -> str | None:
        return self.store.tracking_uri if self.store is not None else None

    @property
    def sweep_run_id(self) -> str | None:
        """The sweep's parent run, once the first job was submitted (None when not recording)."""
        return self.store.sweep_run_id if self.store is not None else None

    def summary(self, prepared: Sequence[PreparedJob]) -> str | None:
        skipped = sum(1 for p in prepared if p.skipped is not None)
        if not skipped:
            return None
        return f"skipped {skipped} of {len(prepared)} configs already recorded in MLflow"

    def flush(self, force: bool = True) -> None:
        """Rewrite run_data.csv (and log it to the sweep's run)."""
        if not self._rows or (not force and time.time() - self._csv_written < _CSV_EVERY_S):
            return
        if self.store is not None and self._metrics_pending:
            metrics = self.store.latest_metrics(self._metrics_pending)
            for row in self._rows.values():
                if row.run_id in metrics:
                    row.metrics = metrics[row.run_id]
            self._metrics_pending.clear()
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        path = self.sweep_dir / RUN_DATA_CSV
        write_run_data_csv(path, list(self._rows.values()))
        self._csv_written = time.time()
        if self.store is not None and force:
            self.store.log_sweep_artifact(path)

    def close(self, interrupted: bool) -> None:
        """Runs still in flight are KILLED (resumable); the sweep run gets its final state."""
        if self.store is not None:
            for item in self._in_flight.values():
                if item.run_id is not None:
                    self.store.finish_job_run(
                        item.run_id, RunStatus.KILLED, error="launcher stopped"
                    )
        self._in_flight.clear()
        self.flush()  # run_data.csv is the sweep's record with or without a store
        if self.store is None:
            return
        failed = any(row.status != RunStatus.FINISHED.value for row in self._rows.values())
        status = (
            RunStatus.KILLED if interrupted else RunStatus.FAILED if failed else RunStatus.FINISHED
        )
        self.store.finish_sweep(status)
        self.store.close()

    def _add_row(
        self,
        item: PreparedJob,
        status: RunStatus,
        value: Any,
        error: str | None,
        *,
        skipped: bool,
        result: JobResult | None = None,
    ) -> JobRow:
        row = JobRow(
            job_num=item.job.job_num,
            overrides=item.job.overrides,
            status=status.value,
            skipped=skipped,
            run_id=item.run_id,
            fingerprint=item.fingerprint,
            output_dir=str(item.job.output_dir),
            return_value=value,
            error=error,
            start=result.started_at if result else None,
            end=result.ended_at if result else None,
            resumed=item.resumed,
        )
        self._rows[item.job.key] = row
        return row


def _outcome(result: JobResult, job_return: JobReturn) -> tuple[RunStatus, Any, str | None]:
    if result.state is JobState.CANCELLED:
        return RunStatus.KILLED, None, result.error
    if job_return.status is JobStatus.COMPLETED:
        return RunStatus.FINISHED, job_return._return_value, None
    error = job_return._return_value
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return RunStatus.FAILED, None, text


def _details(result: JobResult) -> dict[str, Any]:
    slot = result.slot
    return {
        "submitted_at": result.submitted_at,
        "queued_s": None if result.started_at is None else result.started_at - result.submitted_at,
        "pid": result.pid,
        "attempts": result.attempts,
        "slot": None
        if slot is None
        else {"index": slot.index, "device": slot.device, "cpus": slot.cpus},
        "stdout": str(result.stdout_path),
        "stderr": str(result.stderr_path),
    }


def _positive(options: Mapping[str, Any], key: str, default: float) -> float:
    return positive_seconds(f"hydra.launcher.mlflow.{key}", options.get(key, default), default)
