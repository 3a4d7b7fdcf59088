"""Every job an MLflow run: the launcher's ledger, the scheduler's ``Ledger``.

    before_run.py    RunOpener: decide skip / resume / run per batch, claim, open a job's run
    skipped_jobs.py  not_run: a job decided not to run, its result taken from its record
    after_run.py     OutcomeRecorder: FINISHED / FAILED / KILLED, run_data.json, run_data.csv
The ledger opens the store and hands each step to its part; ``close`` ends the sweep's run.
A sweep that runs nothing writes nothing into the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hydra.core.utils import JobReturn
from omegaconf import DictConfig

from furcate_hydra.execution.job import Job
from furcate_hydra.hydra_api.command_line import given_overrides
from furcate_hydra.launching.launcher_options import StoreOptions
from furcate_hydra.launching.streaming import JobRun
from furcate_hydra.layout import SweepPaths
from furcate_hydra.records.after_run import OutcomeRecorder
from furcate_hydra.records.before_run import RunOpener
from furcate_hydra.records.skipped_jobs import not_run
from furcate_hydra.store import (
    CodeVersion,
    Decision,
    RunRecord,
    RunStatus,
    RunStore,
    check_tracking_uri,
    resolve_tracking_uri,
)
from furcate_hydra.store.access import StoreAccess
from furcate_hydra.store.app_imports import remember_imports, remembered_imports
from furcate_hydra.store.run_data import JobRow
from furcate_hydra.tracing import TracePeaks

__all__ = ["RunLedger"]


class RunLedger:
    """The launcher's side of the store; without MLflow it still fingerprints and writes files."""

    def __init__(
        self,
        options: StoreOptions,
        launcher_config: DictConfig,
        code: CodeVersion | None,
        where: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options
        self.code = code
        self.sweep = SweepPaths.of(str(launcher_config.hydra.sweep.dir))
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
        invocation = " ".join(given_overrides(launcher_config, "task"))
        self.before = RunOpener(options, self.access, self.sweep, invocation, code, where or {})
        self.after = OutcomeRecorder(self.access, self.sweep)
        self._imports: list[str] = []  # what the experiment remembered of its jobs' imports

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

    def remembered_imports(self) -> list[str]:
        """What this app's jobs imported themselves in its earlier sweeps (its experiment's
        ``furcate.preload``), once the store is open."""
        if self.store is None:
            return []
        self._imports = remembered_imports(self.store.experiment_tags)
        return self._imports

    def remember_imports(self, modules: Sequence[str]) -> None:
        """Remember for the app's next sweep what its jobs were seen to import."""
        if self.store is not None and modules:
            store = self.store
            remember_imports(store.client, store.experiment_id, modules, self._imports)

    @property
    def tracking_uri(self) -> str | None:
        return self.access.tracking.uri if self.access is not None else None

    @property
    def sweep_run_id(self) -> str | None:
        """The sweep's parent run, once the first job was submitted (None when not recording)."""
        return self.store.sweep_run_id if self.store is not None else None

    # -- before jobs run (before_run.py, skipped_jobs.py) ---------------------------------

    def prepare(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Fingerprint a batch and ``decide`` it."""
        return self.before.prepare(jobs)

    def decide(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Decide a prepared batch (one lookup); None when only MLflow can read the store:
        ``open_store``, then decide again."""
        return self.before.decide(jobs)

    def claim(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> list[Decision]:
        """Claim the configs to run or resume; a lost claim becomes ELSEWHERE."""
        return self.before.claim(jobs, decisions)

    def follow(self, waiting: Sequence[RunRecord]) -> list[Decision | None]:
        """For runs held elsewhere: None while one still runs; else what to do with its job."""
        return self.before.follow(waiting)

    def holder(self, record: RunRecord) -> str:
        """Which launcher holds a run, in words, for the log."""
        return self.before.holder(record)

    def open(self, job: Job, decision: Decision) -> JobReturn | None:
        """The JobReturn of a job that does not run (its record says how it ended), or None
        once the job's run is open (its claim's new run, or the interrupted one) and its env
        is set. Not for ELSEWHERE: such a job waits (``follow``)."""
        job_return = not_run(job, decision, self.access, self.after)
        if job_return is None:
            self.before.open_run(job, decision)
        return job_return

    # -- while it runs, and after (after_run.py) -----------------------------------------

    def started(self, job: Job) -> None:
        """A process started for the job: its run_data.json says RUNNING."""
        self.after.started(job)

    def preempted(self, job: Job) -> None:
        """The job was preempted and queued again: its run counts it."""
        self.after.preempted(job)

    def record(self, job: Job, job_return: JobReturn, peaks: TracePeaks | None = None) -> None:
        """The outcome of a job that ran: its run, run_data.json and its run_data.csv row."""
        self.after.record(job, job_return, peaks)

    def job_run(self, key: str) -> JobRun:
        """A handed-back job's MLflow run (None when not recording), and whether it was
        skipped."""
        return self.after.job_run(key)

    def row(self, key: str) -> JobRow | None:
        """What was recorded of a handed-back job."""
        return self.after.row(key)

    def flush(self, force: bool = True) -> None:
        """Rewrite run_data.csv (and log it to the sweep's run)."""
        self.after.flush(force)

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
        self.before.withdraw_claims()
        self.after.stopped(in_flight, peaks or {}, preempted)
        self.flush()  # run_data.csv is the sweep's record with or without a store
        if self.store is None:
            return
        failed = not self.after.all_finished()
        status = (
            RunStatus.KILLED if interrupted else RunStatus.FAILED if failed else RunStatus.FINISHED
        )
        self.store.finish_sweep(status)
        self.store.close()
