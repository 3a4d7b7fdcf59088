"""After a job: its outcome in its run, its run_data.json and its row of run_data.csv.

started(job)  ──► run_data.json says RUNNING (the store's run is RUNNING from its claim on)
record(job, JobReturn) ──► FINISHED / FAILED / KILLED, return value, artifacts, run_data.json;
                           a row for run_data.csv (kept on disk: SweepRows), the trace's peaks
stopped(in_flight) ──► the launcher stops: runs still in flight KILLED (resumable)
flush() ──► run_data.csv rewritten, with each run's latest metrics (at most every few seconds)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.hydra_api.private_names import returned
from furcate_hydra.launching.streaming import JobRun
from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.store import RunStatus, RunStore, Tags
from furcate_hydra.store.access import StoreAccess
from furcate_hydra.store.run_data import (
    JobRow,
    update_run_data_metrics,
    write_ordered_run_data_csv,
    write_run_data_json,
)
from furcate_hydra.store.sweep_rows import SweepRows
from furcate_hydra.tracing import METRIC_PREFIX, TracePeaks

__all__ = ["OutcomeRecorder", "csv_due"]

# run_data.csv is rewritten at most this often while jobs stream in, and at every batch's end;
# and at most this share of the time: a rewrite reads every row (1.2 s at 100,000 jobs here),
# so at a fixed interval its cost per job grew with the sweep (5 ms a job at 65,000 jobs)
_CSV_EVERY_S = 10.0
_CSV_TIME_SHARE = 0.02
# Most runs whose metrics one store query reads.
_METRICS_CHUNK = 500


def csv_due(now: float, written_at: float, cost_s: float) -> bool:
    """Whether run_data.csv is due a rewrite while jobs stream in: ``_CSV_EVERY_S`` after the
    last, and late enough that rewrites, each ``cost_s`` long, take ``_CSV_TIME_SHARE`` of the
    launcher's time at most."""
    return now - written_at >= max(_CSV_EVERY_S, cost_s / _CSV_TIME_SHARE)


class OutcomeRecorder:
    """Records how jobs ended, in their runs (when recording) and in files (always).

    Keeps nothing per job in memory: a job's record is the caller's, its run_data.csv row is
    written to ``SweepRows`` as the job ends.
    """

    def __init__(self, access: StoreAccess | None, sweep: SweepPaths) -> None:
        self.access = access
        self.sweep = sweep
        self._rows = SweepRows()
        self._csv_written = 0.0
        self._csv_cost_s = 0.0  # how long the last rewrite of run_data.csv took

    @property
    def store(self) -> RunStore | None:
        return self.access.store if self.access is not None else None

    def started(self, job: Job) -> None:
        """A process started for the job: its run_data.json says RUNNING, since when, where.

        Until then its run is RUNNING in the store but the job is queued; ``furcate status``
        tells the two apart by this file.
        """
        row = _row(job, RunStatus.RUNNING, None, None)
        write_run_data_json(job.paths.run_data, row, job.task_config, _details(job))

    def preempted(self, job: Job) -> None:
        """The job was preempted and queued again: its run counts it (``furcate.preemptions``)."""
        if self.store is not None and job.run_id is not None:
            self.store.set_job_tags(job.run_id, {Tags.PREEMPTIONS: str(job.preemptions)})

    def record(self, job: Job, job_return: JobReturn, peaks: TracePeaks | None = None) -> None:
        """The outcome of a job that ran: its run, run_data.json and its run_data.csv row
        (with the peaks of its resource trace, if it has one)."""
        status, value, error = _run_end(job, job_return)
        pending = self.store is not None and job.run_id is not None
        row = self.add_row(job, status, value, error, metrics_pending=pending, peaks=peaks)
        job.paths.output_dir.mkdir(parents=True, exist_ok=True)  # a job that never started
        write_run_data_json(job.paths.run_data, row, job.task_config, _details(job))
        if self.store is not None and job.run_id is not None:
            if job.state is JobState.PREEMPTED:  # the last preemption queued nothing again
                self.preempted(job)
            artifacts = [job.paths.stdout, job.paths.stderr, job.paths.run_data]
            self.store.finish_job_run(
                job.run_id,
                status,
                return_value=value,
                error=error,
                artifacts=artifacts,
                end_time=job.ended_at,
            )

    def stopped(
        self,
        in_flight: Iterable[Job],
        peaks: Mapping[str, TracePeaks | None],
        preempted: str | None,
    ) -> None:
        """The launcher stops: runs of jobs still in flight are KILLED (resumable), with their
        trace's ``peaks`` by job key. ``preempted``: why the launcher itself was preempted; the
        runs of its jobs say so and count it."""
        for job in in_flight:
            # a row and run_data.json for each, so the sweep's record lists what was stopped
            traced = peaks.get(job.key)
            why = preempted or "launcher stopped"
            if preempted is not None and job.run_id is not None:
                job.preemptions += 1
                self.preempted(job)
            row = self.add_row(job, RunStatus.KILLED, None, why, peaks=traced)
            job.paths.output_dir.mkdir(parents=True, exist_ok=True)
            write_run_data_json(job.paths.run_data, row, job.task_config, _details(job))
            if self.store is not None and job.run_id is not None:
                self.store.finish_job_run(job.run_id, RunStatus.KILLED, error=why)

    def all_finished(self) -> bool:
        """Whether every job recorded so far FINISHED (the sweep run's status)."""
        return self._rows.all_finished()

    def add_row(
        self,
        job: Job,
        status: RunStatus,
        value: Any,
        error: str | None,
        metrics_pending: bool = False,
        peaks: TracePeaks | None = None,
    ) -> JobRow:
        """The job's row of run_data.csv, kept; ``metrics_pending``: its run's metrics are
        read into it at the next ``flush``."""
        row = _row(job, status, value, error, peaks)
        self._rows.add(job.key, row, metrics_pending)
        return row

    def job_run(self, key: str) -> JobRun:
        """A handed-back job's MLflow run (None when not recording), and whether it was
        skipped."""
        row = self._rows.get(key)
        return JobRun(row.run_id, row.skipped) if row is not None else JobRun(None)

    def row(self, key: str) -> JobRow | None:
        """What was recorded of a handed-back job."""
        return self._rows.get(key)

    def flush(self, force: bool = True) -> None:
        """Rewrite run_data.csv (and log it to the sweep's run)."""
        due = csv_due(time.time(), self._csv_written, self._csv_cost_s)
        if (not force and not due) or not self._rows:
            return
        began = time.monotonic()
        if self.access is not None:
            while run_ids := self._rows.pending_runs(_METRICS_CHUNK):
                metrics = {
                    run_id: _final_metrics(values)
                    for run_id, values in self.access.latest_metrics(run_ids).items()
                }
                for row in self._rows.set_metrics(run_ids, metrics):
                    update_run_data_metrics(Path(row.output_dir) / JobPaths.RUN_DATA, row.metrics)
        path = self.sweep.run_data_csv
        path.parent.mkdir(parents=True, exist_ok=True)
        write_ordered_run_data_csv(path, self._rows.in_job_order(), self._rows.metric_names)
        self._csv_written = time.time()
        self._csv_cost_s = time.monotonic() - began
        if self.store is not None and force:
            self.store.log_sweep_artifact(path)


def _row(
    job: Job,
    status: RunStatus,
    value: Any,
    error: str | None,
    peaks: TracePeaks | None = None,
) -> JobRow:
    return JobRow(
        job_num=job.num,
        overrides=list(job.overrides),
        status=status.value,
        skipped=job.skipped,
        run_id=job.run_id,
        fingerprint=str(job.fingerprint),
        output_dir=str(job.paths.output_dir),
        return_value=value,
        error=error,
        start=None if job.skipped else job.started_at,
        end=None if job.skipped else job.ended_at,
        resumed=job.resumed,
        rss_peak_mb=_mb(peaks.rss_mb if peaks else None),
        gpu_mem_peak_mb=_mb(peaks.gpu_mem_mb if peaks else None),
    )


def _run_end(job: Job, job_return: JobReturn) -> tuple[RunStatus, Any, str | None]:
    """What a job's run records as it ends: its final status, return value and error."""
    if job.state in (JobState.CANCELLED, JobState.PREEMPTED):  # resumed by the next run
        return RunStatus.KILLED, None, job.error
    if job_return.status is JobStatus.COMPLETED:
        return RunStatus.FINISHED, job_return.return_value, None
    error = returned(job_return)
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return RunStatus.FAILED, None, text


def _final_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """A run's metrics for run_data, less the resource trace's last samples (its peaks are
    columns of their own, and its last sample may or may not be in the store yet)."""
    return {name: value for name, value in metrics.items() if not name.startswith(METRIC_PREFIX)}


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _details(job: Job) -> dict[str, Any]:
    slot = job.slot
    return {
        "submitted_at": job.submitted_at,
        "queued_s": job.queued_s,
        "pid": job.pid,
        "node": job.node,
        "attempts": job.attempts,
        "preemptions": job.preemptions,
        "slot": None
        if slot is None
        else {"index": slot.index, "device": slot.device, "cpus": slot.cpus},
        "stdout": str(job.paths.stdout),
        "stderr": str(job.paths.stderr),
    }
