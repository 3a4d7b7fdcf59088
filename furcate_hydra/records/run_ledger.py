"""Every job an MLflow run: decide skip/resume/run per batch, record outcomes, write run data.

prepare(jobs) ──► fingerprints ──► one store lookup ──► a Decision per job (a sqlite store is
                 read without MLflow until something must be written: needs_store)
claim(jobs, decisions) ──► jobs to run or resume: a claim each, one lookup of rivals ──►
                           lost ones become ELSEWHERE (another launcher holds the config)
open(job, decision) ──► FINISHED before    → JobReturn from the record, not run
                        interrupted/KILLED → same run again, resumes from its checkpoint dir
                        otherwise          → the claim's new RUNNING run (tags, params)
follow(waiting) ──► one lookup: configs held elsewhere that ended (their outcome, as a skip
                    or a failure) or were let go (decided again)
record(job, JobReturn) ──► FINISHED / FAILED / KILLED, return value, artifacts,
                           run_data.json; a row for run_data.csv (kept on disk: SweepRows)
The first batch writes furcate_sweep.json, which says where the sweep records (``furcate status``
starts from it); the first job to run opens the sweep's parent run, and the record names it.
A sweep that runs nothing writes nothing into the store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from furcate_hydra import env_vars
from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.hydra_api.command_line import given_overrides
from furcate_hydra.hydra_api.private_names import returned
from furcate_hydra.launching.launcher_options import StoreOptions
from furcate_hydra.launching.streaming import JobRun
from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.records.job_returns import synthetic_job_return
from furcate_hydra.store import (
    Action,
    Claim,
    ClaimRequest,
    CodeCheck,
    CodeVersion,
    Decision,
    RunRecord,
    RunStatus,
    RunStore,
    Tags,
    check_tracking_uri,
    flatten_params,
    resolve_tracking_uri,
)
from furcate_hydra.store.access import StoreAccess
from furcate_hydra.store.fingerprint import fingerprint
from furcate_hydra.store.run_data import (
    JobRow,
    update_run_data_metrics,
    write_ordered_run_data_csv,
    write_run_data_json,
)
from furcate_hydra.store.sweep_pointer import SweepPointer
from furcate_hydra.store.sweep_rows import SweepRows
from furcate_hydra.tracing import METRIC_PREFIX, TracePeaks

log = logging.getLogger(__name__)

__all__ = ["RunLedger", "csv_due", "sweep_run_name"]

# run_data.csv is rewritten at most this often while jobs stream in, and at every batch's end;
# and at most this share of the time: a rewrite reads every row (1.2 s at 100,000 jobs here),
# so at a fixed interval its cost per job grew with the sweep (5 ms a job at 65,000 jobs)
_CSV_EVERY_S = 10.0
_CSV_TIME_SHARE = 0.02
# MLflow's SQL stores keep 250 characters of a run's name; job and sweep names stay below.
_MAX_RUN_NAME = 240
# Most runs whose metrics one store query reads.
_METRICS_CHUNK = 500


def csv_due(now: float, written_at: float, cost_s: float) -> bool:
    """Whether run_data.csv is due a rewrite while jobs stream in: ``_CSV_EVERY_S`` after the
    last, and late enough that rewrites, each ``cost_s`` long, take ``_CSV_TIME_SHARE`` of the
    launcher's time at most."""
    return now - written_at >= max(_CSV_EVERY_S, cost_s / _CSV_TIME_SHARE)


class RunLedger:
    """The launcher's side of the store; without MLflow it still fingerprints and writes files.

    Keeps nothing per job in memory: a job's record is the caller's, its run_data.csv row is
    written to ``SweepRows`` as the job ends.
    """

    def __init__(
        self,
        options: StoreOptions,
        launcher_config: DictConfig,
        code: CodeVersion | None,
        where: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options
        self.code = code
        self._where = dict(where or {})  # tags of every run: where it ran (a Slurm job)
        self._code_check = CodeCheck(code.key if code else None, options.code_change)
        self.sweep = SweepPaths.of(str(launcher_config.hydra.sweep.dir))
        self._invocation = " ".join(given_overrides(launcher_config, "task"))
        self.access: StoreAccess | None = None  # None: not recording
        if options.enabled:
            tracking = resolve_tracking_uri(options.tracking_uri)
            # before anything runs: an unreachable server, a damaged sqlite file stop the sweep
            check_tracking_uri(tracking)
            self.access = StoreAccess(
                tracking,
                options.experiment_name or str(launcher_config.hydra.job.name),
                heartbeat_s=options.heartbeat_s,
                stale_after_s=options.stale_after_s,
                sqlite_wal=options.sqlite_wal,
                sqlite_index=options.sqlite_index,
            )
        self._started_at: float | None = None  # when the sweep pointer was first written
        self._sweep_recorded = False
        self._rows = SweepRows()
        self._claims: dict[str, Claim] = {}  # won, by job key, until the job's run is opened
        self._csv_written = 0.0
        self._csv_cost_s = 0.0  # how long the last rewrite of run_data.csv took

    # -- the store ----------------------------------------------------------------------

    @property
    def store(self) -> RunStore | None:
        """The store, once MLflow has opened it (``open_store``)."""
        return self.access.store if self.access is not None else None

    @property
    def decides_without_store(self) -> bool:
        """Whether ``prepare`` may decide before the store is opened (not recording, or a
        sqlite file, read without MLflow)."""
        return self.access is None or self.access.can_decide

    def needs_store(self, decisions: Sequence[Decision]) -> bool:
        """Whether these decisions write into the store, which must be opened first."""
        return self.access is not None and self.access.needs_store(decisions)

    def load_store_modules(self) -> None:
        """Import MLflow (seconds), without opening the store."""
        if self.access is not None:
            self.access.load_modules()

    def open_store(self) -> None:
        """Open the store through MLflow, once: from now on everything goes through it."""
        if self.access is not None:
            self.access.open()

    # -- before jobs run ----------------------------------------------------------------

    def prepare(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Fingerprint a batch and ``decide`` it."""
        for job in jobs:
            job.fingerprint = fingerprint(job.task_config, self.options.fingerprint_ignore)
        return self.decide(jobs)

    def decide(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Decide each job of a prepared batch with one store lookup for all of them; None
        when only MLflow can read the store: ``open_store``, then decide again."""
        decisions: dict[str, Decision] = {}
        if self.access is not None:
            fingerprints = {str(j.fingerprint) for j in jobs}
            decided = self.access.decide(fingerprints, self.options.rerun, self._code_check)
            if decided is None:
                return None
            decisions = decided
        if self._started_at is None:
            self._write_sweep_pointer()
        run = Decision(Action.RUN)
        return [decisions.get(str(job.fingerprint), run) for job in jobs]

    def claim(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> list[Decision]:
        """Claim the configs of the jobs about to run or resume, one lookup for all of them.
        A lost claim turns its job's decision into ELSEWHERE: wait for the run that holds it.
        A config twice in the batch is claimed once; its twin waits for that run."""
        if self.store is None:
            return list(decisions)
        self._ensure_sweep_run()
        claiming = [Action.RUN, Action.RESUME]
        requests: list[ClaimRequest] = []
        owners: dict[str, str] = {}  # fingerprint → key of the job that claims it
        for job, decision in zip(jobs, decisions, strict=True):
            fp = str(job.fingerprint)
            if decision.action not in claiming or fp in owners:
                continue
            owners[fp] = job.key
            resumed = decision.record if decision.action is Action.RESUME else None
            checkpoints = (resumed.checkpoint_dir if resumed else None) or job.paths.checkpoint_dir
            requests.append(
                ClaimRequest(
                    fp,
                    (job.label or "defaults")[:_MAX_RUN_NAME],
                    {**self._job_tags(job), Tags.CHECKPOINT_DIR: str(checkpoints)},
                    {} if resumed else flatten_params(job.task_config),
                    resumed,
                )
            )
        claims = {c.request.fingerprint: c for c in self.store.claim(requests)}
        out: list[Decision] = []
        for job, decision in zip(jobs, decisions, strict=True):
            claim = claims.get(str(job.fingerprint))
            if decision.action not in claiming or claim is None:
                out.append(decision)
            elif claim.holder is not None:
                out.append(Decision(Action.ELSEWHERE, claim.holder, "claimed elsewhere first"))
            elif owners[claim.request.fingerprint] == job.key:
                self._claims[job.key] = claim
                out.append(decision)
            else:  # the same config again in this batch: it waits for the first one's run
                held = claim.request.resumes or claim.run
                out.append(Decision(Action.ELSEWHERE, held, "running in this sweep"))
        return out

    def follow(self, waiting: Sequence[RunRecord]) -> list[Decision | None]:
        """For runs held elsewhere: None while one still runs; else what to do with its job."""
        if self.store is None or not waiting:
            return [None] * len(waiting)
        return self.store.follow(waiting, self.options.rerun, self._code_check)

    def holder(self, record: RunRecord) -> str:
        """Which launcher holds a run, in words, for the log."""
        tags = record.tags
        if self.store is not None and self.store.identity.tags().items() <= tags.items():
            return f"this sweep's job #{tags.get(Tags.JOB_NUM, '?')}"
        pid, host = tags.get(Tags.LAUNCHER_PID, "?"), tags.get(Tags.HOST, "?")
        return f"launcher pid {pid} on {host}"

    def open(self, job: Job, decision: Decision) -> JobReturn | None:
        """The JobReturn of a job that does not run (its record says how it ended), or None
        once the job's run is open (its claim's new run, or the interrupted one) and its env
        is set. Not for ELSEWHERE: such a job waits (``follow``)."""
        record = decision.record
        if decision.action is Action.SKIP and record is not None and self.access is not None:
            value = self.access.recorded_return_value(record)
            recorded = Path(record.output_dir) if record.output_dir else None
            # the recorded run's dir holds what the task wrote; once deleted, the new job dir
            # (its .hydra/ files, its log, a run_data.json naming the run) stands in for it
            shown = recorded if recorded is not None and recorded.is_dir() else None
            job.run_id, job.skipped = record.run_id, True
            row = self._add_row(job, RunStatus.FINISHED, value, None, metrics_pending=True)
            job_return = synthetic_job_return(
                job.config, shown or job.paths.output_dir, JobStatus.COMPLETED, value
            )
            self._write_skipped_job_dir(job, row, job_return, recorded, decision)
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
            row = self._add_row(job, record.status, None, str(error))
            job_return = synthetic_job_return(
                job.config, job.paths.output_dir, JobStatus.FAILED, error
            )
            ran_in = Path(record.output_dir) if record.output_dir else None
            self._write_skipped_job_dir(job, row, job_return, ran_in, decision)
            return job_return
        if self.store is not None:
            claim = self._claims.pop(job.key)
            resumed = claim.request.resumes
            if resumed is not None and resumed.output_dir:
                # where the app's own checkpoints of the last attempt are
                job.env[env_vars.RESUMED_OUTPUT_DIR] = resumed.output_dir
            if resumed is not None and resumed.checkpoint_dir:
                # the run keeps its checkpoints where its first attempt wrote them; the new job
                # dir points there, so its checkpoints are found beside its other outputs
                job.paths = JobPaths.of(job.paths.output_dir, resumed.checkpoint_dir)
                _link_checkpoints(job.paths)
            job.run_id = self.store.confirm(claim)
            if resumed is not None:
                job.resumed = True
                log.info("\t#%d resumes MLflow run %s (%s)", job.num, job.run_id, decision.reason)
            job.env.update(
                {
                    env_vars.TRACKING_URI: self.store.tracking_uri,
                    env_vars.RUN_ID: job.run_id,
                    env_vars.EXPERIMENT_ID: self.store.experiment_id,
                }
            )
        job.env[env_vars.OUTPUT_DIR] = str(job.paths.output_dir)
        job.env[env_vars.CHECKPOINT_DIR] = str(job.paths.checkpoint_dir)
        return None

    def _write_skipped_job_dir(
        self,
        job: Job,
        row: JobRow,
        job_return: JobReturn,
        recorded: Path | None,
        decision: Decision,
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

    def _job_tags(self, job: Job) -> dict[str, str]:
        return {
            Tags.FINGERPRINT: str(job.fingerprint),
            Tags.OVERRIDES: " ".join(job.overrides),
            Tags.JOB_NUM: str(job.num),
            Tags.OUTPUT_DIR: str(job.paths.output_dir),
            **(self.code.tags() if self.code is not None else {}),
            **self._where,
        }

    def _ensure_sweep_run(self) -> None:
        """The sweep's parent run, and the sweep dir's record naming it, once."""
        if self._sweep_recorded or self.store is None:
            return
        self._sweep_recorded = True
        self.store.start_sweep(
            sweep_run_name(time.time(), self._invocation),
            {
                Tags.SWEEP_DIR: str(self.sweep.sweep_dir),
                Tags.OVERRIDES: self._invocation,
                **self._where,
            },
        )
        self._write_sweep_pointer()

    def _write_sweep_pointer(self) -> None:
        """furcate_sweep.json: the store and experiment, and the sweep run once there is one."""
        if self._started_at is None:
            self._started_at = time.time()
        access, store = self.access, self.store
        SweepPointer(
            tracking_uri=access.tracking.uri if access else None,
            experiment_id=access.experiment_id if access else None,
            experiment_name=access.experiment if access else None,
            sweep_run_id=store.sweep_run_id if store else None,
            started_at=self._started_at,
            stale_after_s=self.options.stale_after_s,
        ).write(self.sweep.sweep_record)

    # -- while it runs -------------------------------------------------------------------

    def started(self, job: Job) -> None:
        """A process started for the job: its run_data.json says RUNNING, since when, where.

        Until then its run is RUNNING in the store but the job is queued; ``furcate status``
        tells the two apart by this file.
        """
        row = self._row(job, RunStatus.RUNNING, None, None)
        write_run_data_json(job.paths.run_data, row, job.task_config, _details(job))

    def preempted(self, job: Job) -> None:
        """The job was preempted and queued again: its run counts it (``furcate.preemptions``)."""
        if self.store is not None and job.run_id is not None:
            self.store.set_job_tags(job.run_id, {Tags.PREEMPTIONS: str(job.preemptions)})

    # -- after a job ends ---------------------------------------------------------------

    def record(self, job: Job, job_return: JobReturn, peaks: TracePeaks | None = None) -> None:
        """The outcome of a job that ran: its run, run_data.json and its run_data.csv row
        (with the peaks of its resource trace, if it has one)."""
        status, value, error = _run_end(job, job_return)
        pending = self.store is not None and job.run_id is not None
        row = self._add_row(job, status, value, error, metrics_pending=pending, peaks=peaks)
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

    def job_run(self, key: str) -> JobRun:
        """A handed-back job's MLflow run (None when not recording), and whether it was
        skipped."""
        row = self._rows.get(key)
        return JobRun(row.run_id, row.skipped) if row is not None else JobRun(None)

    def row(self, key: str) -> JobRow | None:
        """What was recorded of a handed-back job."""
        return self._rows.get(key)

    @property
    def tracking_uri(self) -> str | None:
        return self.access.tracking.uri if self.access is not None else None

    @property
    def sweep_run_id(self) -> str | None:
        """The sweep's parent run, once the first job was submitted (None when not recording)."""
        return self.store.sweep_run_id if self.store is not None else None

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

    def close(
        self,
        interrupted: bool,
        in_flight: Iterable[Job],
        peaks: Mapping[str, TracePeaks | None] | None = None,
        preempted: str | None = None,
    ) -> None:
        """Runs of jobs still in flight are KILLED (resumable), with their trace's ``peaks``
        by job key; claims of jobs that never started are withdrawn; the sweep run gets its
        state. ``preempted``: why the launcher itself was preempted (its Slurm job's time
        runs out): the runs of its jobs say so and count it (``furcate.preemptions``)."""
        if self.store is not None:
            for claim in self._claims.values():
                self.store.withdraw(claim)
        self._claims.clear()
        for job in in_flight:
            # a row and run_data.json for each, so the sweep's record lists what was stopped
            traced = (peaks or {}).get(job.key)
            why = preempted or "launcher stopped"
            if preempted is not None and job.run_id is not None:
                job.preemptions += 1
                self.preempted(job)
            row = self._add_row(job, RunStatus.KILLED, None, why, peaks=traced)
            job.paths.output_dir.mkdir(parents=True, exist_ok=True)
            write_run_data_json(job.paths.run_data, row, job.task_config, _details(job))
            if self.store is not None and job.run_id is not None:
                self.store.finish_job_run(job.run_id, RunStatus.KILLED, error=why)
        self.flush()  # run_data.csv is the sweep's record with or without a store
        if self.store is None:
            return
        failed = not self._rows.all_finished()
        status = (
            RunStatus.KILLED if interrupted else RunStatus.FAILED if failed else RunStatus.FINISHED
        )
        self.store.finish_sweep(status)
        self.store.close()

    def _add_row(
        self,
        job: Job,
        status: RunStatus,
        value: Any,
        error: str | None,
        metrics_pending: bool = False,
        peaks: TracePeaks | None = None,
    ) -> JobRow:
        row = self._row(job, status, value, error, peaks)
        self._rows.add(job.key, row, metrics_pending)
        return row

    @staticmethod
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


def sweep_run_name(started: float, invocation: str) -> str:
    """The sweep's parent run name: what tells sweeps apart, first, as a narrow column cuts it.

    The local time it started (the UI shows the date beside it) and its command-line overrides,
    ``14:03:27 batch_size=32,64``; a sweep with none is ``14:03:27 sweep``.
    """
    clock = time.strftime("%H:%M:%S", time.localtime(started))
    return f"{clock} {invocation or 'sweep'}"[:_MAX_RUN_NAME]


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


def _link_checkpoints(paths: JobPaths) -> None:
    """``<job dir>/resume`` → the run's checkpoint dir, unless the job dir has its own."""
    link = paths.output_dir / JobPaths.CHECKPOINTS
    if link == paths.checkpoint_dir or os.path.lexists(link):
        return
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(paths.checkpoint_dir, target_is_directory=True)
    except OSError as exc:  # a file system without links: the run's tag still says where
        log.warning("furcate: could not link %s to %s: %s", link, paths.checkpoint_dir, exc)
