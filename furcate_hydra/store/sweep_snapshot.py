"""What a sweep's jobs are doing or did, read back from its store and its sweep dir.

    the sweep's job runs (children of its sweep run) ──► one JobSnapshot per run
         FINISHED (its trial PRUNED) ─► PRUNED        FAILED / KILLED ─► the reason, one line
         RUNNING, launcher gone      ─► INTERRUPTED
         RUNNING, with a RUNNING run_data.json ─► RUNNING (its process started), else QUEUED
    run_data.json of jobs the sweep did not run  ─► SKIPPED (or their recorded failure)

Pure: ``SweepReader`` (sweep_reader.py) gathers the inputs, this module decides what they say,
so the rules are tested without a store.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from furcate_hydra.progress import JobProgress
from furcate_hydra.reasons import interrupted_reason, one_line_reason, pruned_reason
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags, display_return_value

__all__ = [
    "FileRow",
    "JobSnapshot",
    "StoredRun",
    "SweepJobStatus",
    "SweepSnapshot",
    "job_snapshots",
]


class SweepJobStatus(enum.Enum):
    """A job's state as ``furcate status`` shows it, in the order counts are listed."""

    FINISHED = "FINISHED"  # returned a value
    PRUNED = "PRUNED"  # its Optuna trial was pruned: it stopped early, on purpose
    SKIPPED = "SKIPPED"  # not run: its config had FINISHED in an earlier run
    FAILED = "FAILED"  # raised, exited or crashed
    KILLED = "KILLED"  # stopped by its launcher (Ctrl-C, SIGTERM); resumable
    INTERRUPTED = "INTERRUPTED"  # left RUNNING by a launcher that is gone; resumable
    RUNNING = "RUNNING"  # its process runs on a slot
    QUEUED = "QUEUED"  # its run is open, its process has not started yet


@dataclass(frozen=True)
class JobSnapshot:
    """One job of the sweep.

    Attributes:
        job_num: Hydra's job number.
        overrides: The job's overrides.
        status: Where it is.
        error: Why it did not finish, in one line (None when it did).
        start: When it started (seconds since the epoch), None while queued.
        duration_s: How long it ran, or has been running.
        return_value: What the task returned (FINISHED, PRUNED, SKIPPED).
        metrics: The run's latest value of each metric.
        run_id: Its MLflow run (for a skipped job, the run it was taken from).
        output_dir: Its job dir.
        resumed: Whether its run continues an interrupted one.
        progress: The epoch and step a running job last reported (``progress.json``).
        rss_peak_mb: The highest resident memory of its processes (MiB) in the launcher's
            resource trace, once it ended; ``gpu_mem_peak_mb`` the GPU memory they held.
        ran_in: The Slurm job and node its run ran in (``slurm 12_3 on node7``), if any.
    """

    job_num: int
    overrides: tuple[str, ...]
    status: SweepJobStatus
    error: str | None = None
    start: float | None = None
    duration_s: float | None = None
    return_value: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None
    output_dir: str | None = None
    resumed: bool = False
    progress: JobProgress | None = None
    rss_peak_mb: float | None = None
    gpu_mem_peak_mb: float | None = None
    ran_in: str | None = None


@dataclass(frozen=True)
class SweepSnapshot:
    """A sweep as read at one moment.

    Attributes:
        sweep_dir: Its sweep dir.
        status: The sweep run's state (``RUNNING``, ``INTERRUPTED``, ``FINISHED``, ``FAILED``,
            ``KILLED``), or ``NOT RECORDED`` for a sweep without a store; a sweep that ran
            nothing has no sweep run: ``FINISHED`` (or ``FAILED``, with recorded failures).
        reason: Why it counts as interrupted, if it does; that it ran nothing.
        tracking_uri: Its store (None without one).
        experiment: Its experiment's name.
        sweep_run_id: Its sweep run.
        command: The overrides it was started with.
        start: When it started; ``end`` when it ended (None while running).
        jobs: Its jobs, by job number.
    """

    sweep_dir: Path
    status: str
    reason: str | None
    tracking_uri: str | None
    experiment: str | None
    sweep_run_id: str | None
    command: str
    start: float | None
    end: float | None
    jobs: tuple[JobSnapshot, ...]

    def counts(self) -> dict[SweepJobStatus, int]:
        """Jobs per status, every status listed (0 where none)."""
        counts = dict.fromkeys(SweepJobStatus, 0)
        for job in self.jobs:
            counts[job.status] += 1
        return counts


@dataclass(frozen=True)
class StoredRun:
    """A job run as the store holds it."""

    record: RunRecord
    end_time_ms: int | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class FileRow:
    """A job's ``run_data.json`` (what the launcher wrote when it ended or skipped it)."""

    job_num: int
    overrides: tuple[str, ...]
    status: str
    skipped: bool
    run_id: str | None
    output_dir: str
    return_value: Any
    error: str | None
    start: float | None
    end: float | None
    resumed: bool
    metrics: dict[str, float]
    pid: int | None = None
    rss_peak_mb: float | None = None
    gpu_mem_peak_mb: float | None = None
    # a config of this sweep that another launcher sharing the store ran (a job array's)
    ran_elsewhere: bool = False

    @classmethod
    def read(cls, path: Path) -> FileRow | None:
        """The row in ``path``; None when it is missing, half-written by an old launcher or not
        a run_data.json."""
        try:
            data = json.loads(path.read_bytes())
            return cls(
                job_num=int(data["job_num"]),
                overrides=tuple(str(o) for o in data["overrides"]),
                status=str(data["status"]),
                skipped=bool(data.get("skipped", False)),
                run_id=data.get("run_id"),
                output_dir=str(data.get("output_dir") or path.parent),
                return_value=data.get("return_value"),
                error=data.get("error"),
                start=_float(data.get("start")),
                end=_float(data.get("end")),
                resumed=bool(data.get("resumed", False)),
                metrics={str(k): float(v) for k, v in dict(data.get("metrics") or {}).items()},
                pid=int(data["pid"]) if data.get("pid") else None,
                rss_peak_mb=_float(data.get("rss_peak_mb")),
                gpu_mem_peak_mb=_float(data.get("gpu_mem_peak_mb")),
                ran_elsewhere=bool(data.get("ran_elsewhere", False)),
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None


def job_snapshots(
    runs: Iterable[StoredRun],
    rows: Iterable[FileRow],
    *,
    gone: Callable[[RunRecord], str | None],
    progress: Callable[[str], JobProgress | None],
    alive: Callable[[int], bool],
    pruned_epochs: Mapping[str, int | None],
    recorded: Mapping[str, StoredRun],
    now: float,
) -> tuple[JobSnapshot, ...]:
    """Every job, by job number: the sweep's runs first, then the rows of jobs it did not run.

    Args:
        runs: The sweep run's children.
        rows: run_data.json rows this sweep wrote: of jobs it ran (written when each process
            started, again when it ended) and of jobs it skipped.
        gone: Why a RUNNING run's launcher is gone, or None while it may be alive.
        progress: What a running job in this output dir last reported.
        alive: Whether a job process (pid) runs: for a sweep without a store, whose rows are
            all there is.
        pruned_epochs: Per run whose trial was PRUNED, the epoch that got it pruned.
        recorded: The runs that skipped jobs were taken from, by run id.
        now: The time durations of running jobs are measured to.
    """
    jobs: dict[int, JobSnapshot] = {}
    by_run = {row.run_id: row for row in rows if row.run_id}
    for run in runs:
        row = by_run.get(run.record.run_id)
        snapshot = _from_run(run, row, gone, pruned_epochs, now)
        if snapshot.status is SweepJobStatus.RUNNING and snapshot.output_dir:
            snapshot = replace(snapshot, progress=progress(snapshot.output_dir))
        jobs[snapshot.job_num] = snapshot
    for row in rows:
        if row.job_num in jobs:
            continue
        snapshot = _from_row(row, recorded.get(row.run_id or ""), pruned_epochs)
        if snapshot.status is SweepJobStatus.RUNNING:  # no store says whether it still runs
            if row.pid is not None and alive(row.pid):
                snapshot = replace(snapshot, duration_s=_duration(row.start, now))
            else:
                why = "its process is gone and no store recorded how it ended"
                snapshot = replace(
                    snapshot, status=SweepJobStatus.INTERRUPTED, error=interrupted_reason(why)
                )
        jobs[row.job_num] = snapshot
    return tuple(jobs[num] for num in sorted(jobs))


def _from_run(
    run: StoredRun,
    row: FileRow | None,
    gone: Callable[[RunRecord], str | None],
    pruned_epochs: Mapping[str, int | None],
    now: float,
) -> JobSnapshot:
    record = run.record
    tags = record.tags
    start: float | None = row.start if row and row.start else record.start_time_ms / 1000
    end = row.end if row and row.end else _seconds(run.end_time_ms)
    error = tags.get(Tags.ERROR) or (row.error if row else None)
    value = _return_value(tags, row)
    if record.status is RunStatus.FINISHED and record.run_id in pruned_epochs:
        status, reason = SweepJobStatus.PRUNED, pruned_reason(pruned_epochs[record.run_id])
    elif record.status is RunStatus.FINISHED:
        status, reason = SweepJobStatus.FINISHED, None
    elif record.status is RunStatus.KILLED:
        status, reason = SweepJobStatus.KILLED, one_line_reason(error) or "stopped"
    elif record.status is RunStatus.FAILED:
        status, reason = SweepJobStatus.FAILED, one_line_reason(error) or "failed"
    else:  # RUNNING, SCHEDULED; a row, written when its process started, says it did
        why = gone(record)
        start = row.start if row else None
        if why is not None:
            status, reason, end = SweepJobStatus.INTERRUPTED, interrupted_reason(why), None
        elif row is not None:
            status, reason, end = SweepJobStatus.RUNNING, None, now
        else:
            status, reason, end = SweepJobStatus.QUEUED, None, None
    overrides = row.overrides if row else tuple(tags.get(Tags.OVERRIDES, "").split())
    return JobSnapshot(
        job_num=_job_num(tags, row),
        overrides=overrides,
        status=status,
        error=reason,
        start=start,
        duration_s=_duration(start, end),
        return_value=value,
        metrics=dict(run.metrics),
        run_id=record.run_id,
        ran_in=_where_it_ran(tags),
        output_dir=tags.get(Tags.OUTPUT_DIR) or (row.output_dir if row else None),
        resumed=int(tags.get(Tags.RESUMED, "0") or 0) > 0,
        rss_peak_mb=row.rss_peak_mb if row else None,
        gpu_mem_peak_mb=row.gpu_mem_peak_mb if row else None,
    )


def _from_row(
    row: FileRow, recorded: StoredRun | None, pruned_epochs: Mapping[str, int | None]
) -> JobSnapshot:
    """A job known from its run_data.json alone: one the sweep skipped (it finished before) or
    reported failed without running (``rerun=none``), or any job of a sweep without a store."""
    metrics = dict(recorded.metrics) if recorded else dict(row.metrics)
    start, end = row.start, row.end
    if row.ran_elsewhere and recorded is not None:  # when it ran, in the launcher that ran it
        start = recorded.record.start_time_ms / 1000
        end = _seconds(recorded.end_time_ms)
    if row.status == RunStatus.FINISHED.value:
        # another launcher of the sweep ran it: it is no earlier run's repeat
        done = not row.skipped or row.ran_elsewhere
        status = SweepJobStatus.FINISHED if done else SweepJobStatus.SKIPPED
        reason = None
        if row.run_id in pruned_epochs:  # skipped, but what it repeats was a pruned trial
            reason = pruned_reason(pruned_epochs[row.run_id or ""])
    elif row.status == RunStatus.RUNNING.value:
        status, reason = SweepJobStatus.RUNNING, None
    else:
        status = SweepJobStatus.__members__.get(row.status, SweepJobStatus.FAILED)
        reason = one_line_reason(row.error) or row.status.lower()
    return JobSnapshot(
        job_num=row.job_num,
        overrides=row.overrides,
        status=status,
        error=reason,
        start=start,
        duration_s=_duration(start, end),
        return_value=row.return_value,
        metrics=metrics,
        run_id=row.run_id,
        output_dir=row.output_dir,
        resumed=row.resumed,
        rss_peak_mb=row.rss_peak_mb,
        gpu_mem_peak_mb=row.gpu_mem_peak_mb,
        ran_in=_where_it_ran(recorded.record.tags) if recorded else None,
    )


def _where_it_ran(tags: Mapping[str, str]) -> str | None:
    """Where a run's launcher ran, for ``furcate status``: its Slurm job and node."""
    job = tags.get(Tags.SLURM_JOB)
    if not job:
        return None
    node = tags.get(Tags.SLURM_NODE)
    return f"slurm {job}" + (f" on {node}" if node else "")


def _return_value(tags: Mapping[str, str], row: FileRow | None) -> Any:
    if row is not None and row.return_value is not None:
        return row.return_value  # as the task returned it, made JSON-able by the launcher
    text = tags.get(Tags.RETURN_VALUE)
    return None if text is None else display_return_value(text)


def _job_num(tags: Mapping[str, str], row: FileRow | None) -> int:
    if row is not None:
        return row.job_num
    try:
        return int(tags.get(Tags.JOB_NUM, "-1"))
    except ValueError:
        return -1


def _duration(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max(end - start, 0.0), 3)


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
