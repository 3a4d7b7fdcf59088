"""Translate Hydra's launcher calls into executor calls, and finished jobs into JobReturns.

launch(overrides...) ──► every job's dir and log inside the sweep dir? (check_batch_paths, before
                        the pool starts; job_dirs) ──► else refused, nothing runs
                    ──► compose each job's config here (SweepComposer, job num/id): a JobRecord
                    ──► recorder: fingerprint, one MLflow lookup per chunk ──► skip / resume / run
                    ──► the first job that is not skipped warms the session up: the fork server
                        (a fork of this process), then MLflow opens the store; a sweep whose
                        every job is skipped starts neither
                    ──► recorder: claim the configs to run, one lookup of rivals per chunk ──►
                        lost: held by another launcher, waited for (no process started)
                    ──► executor.submit(record: payload = config, env = run + dirs + trial)
                    ◄── record, state final ──► JobReturn (COMPLETED / FAILED with a typed error)
                    ──► recorder: run's final status, return value, artifacts, run data
wait_any also follows the configs held elsewhere (one lookup every ELSEWHERE_POLL_S): one that
ended there comes back with that run's outcome; one let go there is decided and claimed again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.errors import ExecutorBrokenError, FurcateConfigError, JobCrashedError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.executor import EventKind, JobEvent
from furcate_hydra.execution.job import JobRecord, JobState
from furcate_hydra.hydra_layer.backends import plan_for, start_executor
from furcate_hydra.hydra_layer.compose import SweepComposer
from furcate_hydra.hydra_layer.hydra_private import returned
from furcate_hydra.hydra_layer.job_context import (
    HydraJobContext,
    JobOutcome,
    RemoteTraceback,
    job_payload,
)
from furcate_hydra.hydra_layer.job_dirs import check_job_name, check_job_paths, job_output_dir
from furcate_hydra.hydra_layer.job_returns import synthetic_job_return
from furcate_hydra.hydra_layer.launcher_options import LauncherOptions
from furcate_hydra.hydra_layer.options import as_option_error
from furcate_hydra.hydra_layer.recording import JobRecorder
from furcate_hydra.hydra_layer.streaming import LOOKUP_CHUNK, JobRequest, JobRun
from furcate_hydra.hydra_layer.task_code import task_code_version
from furcate_hydra.hydra_layer.task_config import as_job, task_container
from furcate_hydra.layout import JobPaths
from furcate_hydra.monitor.summary import SweepSummary, Unfinished
from furcate_hydra.monitor.tally import SweepTally
from furcate_hydra.monitor.views import make_view
from furcate_hydra.reasons import one_line_reason, pruned_reason
from furcate_hydra.store import Action, Decision, RunRecord, database_opened
from furcate_hydra.store.trace_log import TraceLog
from furcate_hydra.tracing import ResourceTracer, TracePeaks

log = logging.getLogger(__name__)

__all__ = [
    "ELSEWHERE_POLL_S",
    "LaunchSession",
    "check_batch_paths",
    "launch",
    "streaming",
    "task_overrides",
]

# How often the store is asked about configs other launchers hold (one lookup for all of them).
ELSEWHERE_POLL_S = 1.0


class LaunchSession:
    """An executor plus the Hydra context: overrides become jobs, finished jobs JobReturns.

    Lives as long as its launcher, so a sweeper calling ``launch`` batch after batch (or using
    ``submit_batch``/``wait_any``) keeps one warm pool. Holds a job's record from submission
    until ``wait_any`` hands its JobReturn back, and nothing of the job after that (its
    run_data.csv row goes to the recorder's table on disk).
    """

    def __init__(
        self,
        options: LauncherOptions,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
        composer: SweepComposer | None = None,
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        # Plan before anything runs, so bad options cost nothing. Nothing starts here: the
        # fork server and the store wait for the first job that is not skipped (warm_up).
        check_job_name(config)  # it names the store's experiment
        try:
            plan = plan_for(options)
            code = task_code_version(task_function, config)
            self.recorder = JobRecorder(options.store, config, code)
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        log.info("furcate: %s", plan.describe())
        self._context = self._context_blob()
        self.tally = SweepTally(len(plan.slots))
        self.view = make_view(options.progress.mode, self.tally, options.progress.every_s)
        self._view_on = False
        self._warm = False
        output = self.view.write_output if self.view.owns_output else None
        self.executor = start_executor(plan, self._context, options, output, self._fork_context)
        self.executor.add_listener(self.tally.on_event)
        self.executor.add_listener(self._on_event)
        # started with the first job that runs (warm_up): its thread would keep the fork
        # server from being a fork, its MLflow client would load MLflow for a rerun
        self._trace_interval_s = options.trace_interval_s
        self.tracer: ResourceTracer | None = None
        self.summary = SweepSummary()
        self.fail_fast = options.fail_fast
        self._job_env = options.training.job_env()  # every job's, before its own
        self._failing_fast: str | None = None  # why no more jobs start (fail_fast)
        self._stopped_note: tuple[int, int] | None = None  # queued and running jobs then
        self._jobs: dict[str, JobRecord] = {}  # submitted, not yet handed back
        self._ready: list[tuple[str, JobReturn]] = []  # skipped: handed back at the next wait
        # held by other launchers: the job and the run it waits for
        self._elsewhere: dict[str, tuple[JobRecord, RunRecord]] = {}
        self._next_follow = 0.0
        self.composer = composer or SweepComposer(hydra_context, config)
        # over one streaming() block, for the log; stale: skipped, though other code finished it;
        # elsewhere: ran in another launcher while this one waited
        self.submitted = self.skipped = self.skipped_stale = self.elsewhere = 0
        self.in_stream = False  # inside streaming(): the summary is written when it ends
        self._closed = False

    @classmethod
    def start(
        cls,
        options: LauncherOptions,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
        composer: SweepComposer | None = None,
    ) -> LaunchSession:
        """A new session, its signal handlers installed before the fork server's warm-up, so
        that a Ctrl-C during it is never lost; one during it ends the app with one line.
        ``composer``: one the caller composed jobs with already (its configs are cached)."""
        interrupts.install()
        try:
            return cls(options, hydra_context, task_function, config, composer)
        except KeyboardInterrupt:
            interrupts.restore()
            log.warning("furcate: interrupted while starting; no job ran")
            raise SystemExit(128 + (interrupts.received() or signal.SIGINT)) from None
        except BaseException:
            interrupts.restore()
            raise

    def refresh_context(self) -> None:
        """Ship the singleton state to the fork server again if it changed (new resolvers)."""
        context = self._context_blob()
        if context != self._context:
            self._context = context
            self.executor.set_context(context)

    def submit_batch(self, requests: Sequence[JobRequest]) -> list[JobRecord]:
        """Compose, look up (one store query for the batch), claim (one more) and queue jobs.

        Jobs already recorded as FINISHED are not run: their JobReturns, carrying the recorded
        return value, come out of the next ``wait_any``. Jobs whose config another launcher
        holds come out once it ended there, with its outcome.
        """
        jobs = [self._compose(request) for request in requests]
        if not self.recorder.decides_without_store:
            self.warm_up()  # the lookup needs the store, and the server is forked before it
        if self._failing_fast is not None:
            for job in jobs:  # never started, never recorded: a rerun runs them
                self.submitted += 1
                job.state, job.error = JobState.CANCELLED, f"not started: {self._failing_fast}"
                self._ready.append((job.key, self._not_started(job)))
            return jobs
        self.submitted += len(jobs)
        decisions = self.recorder.prepare(jobs)
        if decisions is None:  # only MLflow can read this store: open it first
            self.warm_up()
            decisions = self.recorder.decide(jobs)
            assert decisions is not None
        self._dispatch(jobs, decisions)
        return jobs

    def _dispatch(self, jobs: Sequence[JobRecord], decisions: Sequence[Decision]) -> None:
        if self.recorder.needs_store(decisions) or any(
            d.action not in (Action.SKIP, Action.REPORT_FAILURE) for d in decisions
        ):
            if not self._warm:
                self.warm_up()
                # Loading MLflow took seconds since the lookup: another launcher may have
                # claimed, or even finished, some of these configs meanwhile, and a claim only
                # sees RUNNING rivals. Decide again, now, before claiming.
                decisions = self.recorder.decide(jobs) or decisions
            self.start_view()
        decisions = self.recorder.claim(jobs, decisions)
        for job, decision in zip(jobs, decisions, strict=True):
            interrupts.check()  # composing a batch can take a while: a lost Ctrl-C stops it
            if decision.action is Action.ELSEWHERE and decision.record is not None:
                if not self._elsewhere:  # its run has just been seen RUNNING: not at once
                    self._next_follow = time.monotonic() + ELSEWHERE_POLL_S
                self._elsewhere[job.key] = (job, decision.record)
                log.info(
                    "\t#%d : %s (running elsewhere: %s, MLflow run %s; waiting for it)",
                    job.num,
                    job.label,
                    self.recorder.holder(decision.record),
                    decision.record.run_id,
                )
                continue
            # Each job is handed to the executor as soon as its run exists, not after the batch.
            skipped = self.recorder.open(job, decision)
            if skipped is not None:
                self.tally.skipped()
                if decision.ran_elsewhere:
                    self.elsewhere += 1
                    log.info("\t#%d : %s (ran elsewhere: run %s)", job.num, job.label, job.run_id)
                else:
                    self.skipped += 1
                    self.skipped_stale += decision.other_code
                    log.info("\t#%d : %s (skipped: run %s)", job.num, job.label, job.run_id)
                self._ready.append((job.key, skipped))
                if skipped.status is JobStatus.COMPLETED:
                    self.summary.finished(job.num, skipped.return_value, skipped=True)
                else:  # a recorded failure, reported (rerun=none)
                    self._did_not_finish(job, skipped)
                continue
            log.info("\t#%d : %s", job.num, job.label)
            job.payload = job_payload(job.config)
            self.tally.submitted()  # before submit: the executor may start it at once
            try:
                self.executor.submit(job)
            except ExecutorBrokenError as exc:
                # Its run is open: record it failed, with why, before the error goes on.
                job.state, job.error = JobState.LOST, str(exc)
                self._finish(job)
                raise
            self._jobs[job.key] = job

    def warm_up(self) -> None:
        """What the first job that is not skipped does first (once; callable before, as the
        benchmarks do): MLflow's modules, then the fork server (a fork of this process: it
        gets them, and the task's, for free; made before the store opens, so it shares no
        connection), then the store while the server loads anything it still needs, then
        wait for the server. A Ctrl-C during it ends the app with one line."""
        if self._warm:
            return
        try:
            self.recorder.load_store_modules()
            self.executor.start()
            self.recorder.open_store()
            self.executor.wait_ready()
            self.tracer = start_tracer(self._trace_interval_s, self.recorder.tracking_uri)
        except KeyboardInterrupt:
            log.warning("furcate: interrupted while starting; no job ran")
            raise SystemExit(128 + (interrupts.received() or signal.SIGINT)) from None
        self._warm = True

    def start_view(self) -> None:
        """Show the progress view (after the fork: a fork copies no other thread)."""
        if not self._view_on:
            self._view_on = True
            self.view.start()

    def stop_view(self) -> None:
        if self._view_on:
            self._view_on = False
            self.view.stop()

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        """Jobs that ended: here, or (held elsewhere) in another launcher; at least one unless
        ``timeout`` passed or nothing is in flight."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._elsewhere and time.monotonic() >= self._next_follow:
                self._follow()
            if self._ready:
                ready, self._ready = self._ready, []
                return ready + [(j.key, self._finish(j)) for j in self.executor.wait_any(0)]
            now = time.monotonic()
            wait = None if deadline is None else max(0.0, deadline - now)
            if self._elsewhere:
                due = max(0.0, self._next_follow - now)
                wait = due if wait is None else min(wait, due)
            if self.executor.pending:
                returns = [(j.key, self._finish(j)) for j in self.executor.wait_any(wait)]
                self.recorder.flush(force=False)
                if returns:
                    return returns
            elif self._elsewhere and wait:
                interrupts.check()
                time.sleep(min(wait, ELSEWHERE_POLL_S))
            if not self._elsewhere and not self.executor.pending:
                return []
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _follow(self) -> None:
        """One lookup for every config held elsewhere: those that ended there are ready, with
        that run's outcome; those let go (stopped, their launcher gone) are decided again."""
        waiting = list(self._elsewhere.values())
        again: list[tuple[JobRecord, Decision]] = []
        for (job, _), decision in zip(
            waiting, self.recorder.follow([r for _, r in waiting]), strict=True
        ):
            if decision is None:
                continue
            del self._elsewhere[job.key]
            again.append((job, decision))
        if again:
            self._dispatch([j for j, _ in again], [d for _, d in again])
        self._next_follow = time.monotonic() + ELSEWHERE_POLL_S

    def job_run(self, key: str) -> JobRun:
        """A submitted job's MLflow run: its own, or the one it waits for elsewhere."""
        held = self._elsewhere.get(key)
        if held is not None:
            return JobRun(held[1].run_id, elsewhere=True)
        return self.recorder.job_run(key)

    def job_pruned(self, key: str, epoch: int | None) -> None:
        """A handed-back job whose trial the sweeper pruned: its row in the summary says at
        which epoch. Told after the sweep's ``launch`` returned (a batch sweeper tells its
        trials then), summary.md is written again with it."""
        row = self.recorder.row(key)
        if row is None:
            return
        label = " ".join(task_overrides(row.overrides))
        logs = str(JobPaths.of(row.output_dir).logs)
        self.summary.pruned_job(
            Unfinished(row.job_num, label, "pruned", pruned_reason(epoch), logs)
        )
        if not self.in_stream:
            self.write_summary(console=False)

    @property
    def idle_slots(self) -> int:
        return self.executor.idle_slots

    @property
    def jobs_ahead(self) -> int:
        """Jobs worth submitting beyond the free slots: forked ahead, one per slot, each starts
        the moment a slot frees. 0 under fail_fast, where no job may start on the slot of
        one that failed (and a job never started should have no run)."""
        return 0 if self.fail_fast else self.executor.slot_count

    def sweep_status(
        self, to_come: int | None = None, best: str | None = None, pruned: int | None = None
    ) -> None:
        """What the sweeper knows for the progress view: jobs it will still submit, its best
        result so far, trials it pruned."""
        self.tally.sweeper_status(to_come, best, pruned)

    def close(self, interrupted: bool = False) -> int:
        """Stop the executor; record jobs still running as KILLED and the sweep's final state.
        Returns how many jobs were stopped."""
        if self._closed:
            return 0
        self._closed = True
        self.stop_view()
        self.executor.close()
        stopped = len(self._jobs)
        for job in self._jobs.values():  # the summary counts what the interrupt stopped
            started = job.started_at is not None
            self.summary.did_not_finish(
                Unfinished(
                    job.num,
                    job.label,
                    "killed" if started else "not started",
                    "launcher stopped",
                    str(job.paths.logs),
                )
            )
        peaks = {key: self._end_trace(key) for key in self._jobs}
        if self.tracer is not None:
            self.tracer.close()  # the last metrics and plots, before the store closes
        self.recorder.close(interrupted, self._jobs.values(), peaks)
        self._jobs.clear()
        self._elsewhere.clear()  # nothing of this launcher's: the other one records them
        interrupts.restore()
        return stopped

    def _on_event(self, event: JobEvent) -> None:
        if event.kind is EventKind.STARTED:
            job = event.job
            self.recorder.started(job)
            # the tracer reads this machine's processes: a job on a Ray node has a pid there
            if self.tracer is not None and job.pid is not None and job.node is None:
                self.tracer.start(
                    job.key,
                    job.pid,
                    job.started_at or event.at,
                    device=job.slot.device if job.slot is not None else None,
                    paths=job.paths,
                    run_id=job.run_id,
                    title=f"job {job.name}",
                )
        elif event.kind is EventKind.PREEMPTED:
            self.summary.preempted()
            self.recorder.preempted(event.job)
        elif event.kind is EventKind.ENDED and self.fail_fast and self._failing_fast is None:
            # at once, before the executor gives the slot its next job
            job = event.job
            job_return = self._to_job_return(job)
            if job_return.status is not JobStatus.COMPLETED:
                outcome = _outcome(job, _error_text(job, job_return))
                if outcome != "not started":
                    self._start_no_more(job, outcome)

    def _end_trace(self, key: str) -> TracePeaks | None:
        return self.tracer.end(key) if self.tracer is not None else None

    def _compose(self, request: JobRequest) -> JobRecord:
        num = request.num
        sweep_config = _job_config(self.composer, request)
        with as_job(sweep_config):
            check_job_paths(sweep_config, self.recorder.sweep.sweep_dir, _name(request))
            paths = JobPaths.of(job_output_dir(sweep_config))
            task = task_container(sweep_config)
        return JobRecord(
            key=str(num),
            num=num,
            overrides=tuple(request.overrides),
            label=_label(request),
            paths=paths,
            env={**self._job_env, **request.env},
            config=sweep_config,
            task_config=task,
        )

    def _finish(self, job: JobRecord) -> JobReturn:
        self._jobs.pop(job.key, None)
        peaks = self._end_trace(job.key)
        job_return = self._to_job_return(job)
        self.recorder.record(job, job_return, peaks)
        if peaks is not None:
            self.summary.peaks(job.num, peaks.rss_mb, peaks.gpu_mem_mb)
        ok = job_return.status is JobStatus.COMPLETED
        self.tally.finished(ok)
        if ok:
            self.summary.finished(job.num, job_return.return_value)
        else:
            self._did_not_finish(job, job_return)
        return job_return

    def _did_not_finish(self, job: JobRecord, job_return: JobReturn) -> None:
        """Say why at once, keep the summary's row, and under fail_fast start nothing more."""
        text = _error_text(job, job_return)
        outcome = _outcome(job, text)
        reason = one_line_reason(text) or outcome
        logs = job.paths.logs
        self.summary.did_not_finish(Unfinished(job.num, job.label, outcome, reason, str(logs)))
        if outcome == "not started":
            return
        log.warning("furcate: job #%d %s: %s (logs: %s)", job.num, outcome, reason, logs)
        if self.fail_fast and self._failing_fast is None:
            self._start_no_more(job, outcome)
        if self._stopped_note is not None:  # said after the job that made it stop
            log.warning(
                "furcate: fail_fast: %d queued job(s) and any the sweeper submits are not "
                "started; the %d running one(s) finish",
                *self._stopped_note,
            )
            self._stopped_note = None

    def _start_no_more(self, job: JobRecord, outcome: str) -> None:
        """fail_fast: the jobs queued are cancelled, and any submitted later not started."""
        self._failing_fast = f"hydra.launcher.fail_fast after job #{job.num} {outcome}"
        queued = [key for key, held in self._jobs.items() if held.state is JobState.QUEUED]
        self.executor.cancel(queued)
        running = sum(1 for held in self._jobs.values() if held.state is JobState.RUNNING)
        self._stopped_note = (len(queued), running)

    def _not_started(self, job: JobRecord) -> JobReturn:
        job_return = self._to_job_return(job)
        self.tally.finished(False)
        self._did_not_finish(job, job_return)
        return job_return

    def write_summary(self, console: bool = True) -> None:
        """The summary: on the console, and as summary.md in the sweep dir."""
        snap = self.tally.snapshot()
        if console:
            log.info(self.summary.text(snap.elapsed_s, snap.best))
        text = self.summary.markdown(snap.elapsed_s, snap.best).encode()
        atomic_write_bytes(self.recorder.sweep.summary, text, durable=False)

    def _fork_context(self) -> HydraJobContext | None:
        """What the fork server starts jobs from if it is a fork of this process, asked as
        it starts: none where MLflow has database connections open here (an earlier launch
        in this process, a value read back by a sweeper), which its jobs would share. A fork
        has Hydra's singletons as they are then."""
        if database_opened():
            return None
        return HydraJobContext(self.task_function, self.hydra_context, None)

    def _context_blob(self) -> bytes:
        context = HydraJobContext(self.task_function, self.hydra_context, Singleton.get_state())
        return bytes(cloudpickle.dumps(context))

    @staticmethod
    def _to_job_return(job: JobRecord) -> JobReturn:
        if job.state is JobState.COMPLETED and isinstance(job.value, JobOutcome):
            job_return = job.value.job_return
            if job.value.traceback is not None:
                error = returned(job_return)
                logs = f"\n{job.paths.see_logs()}"
                error.__cause__ = RemoteTraceback(job.value.traceback + logs)
            return job_return
        error = JobCrashedError(f"Job {job.name} {job.state.value}: {job.error}")
        return synthetic_job_return(job.config, job.paths.output_dir, JobStatus.FAILED, error)


def start_tracer(interval_s: float, tracking_uri: str | None) -> ResourceTracer | None:
    """The resource trace of the session's jobs, into their runs when recording; None when
    ``hydra.launcher.trace_interval_s`` is 0."""
    if interval_s <= 0:
        return None
    return ResourceTracer(interval_s, TraceLog(tracking_uri) if tracking_uri else None)


def check_batch_paths(
    composer: SweepComposer,
    sweep_dir: str,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> None:
    """Refuse a ``launch()`` batch of which a job would write outside the sweep dir, before
    any of it runs (Hydra's basic sweeper hands over the whole sweep at once). Each config is
    composed here and again when its chunk is submitted, so that no more than a chunk of
    configs is held at a time."""
    # No interrupts.check() here: the session's handlers are not installed yet, so a Ctrl-C is
    # Python's own KeyboardInterrupt, and a signal remembered by an earlier session in this
    # process is not this launch's.
    for i, overrides in enumerate(job_overrides):
        request = JobRequest(overrides, initial_job_idx + i)
        sweep_config = _job_config(composer, request)
        with as_job(sweep_config):
            check_job_paths(sweep_config, sweep_dir, _name(request))


def launch(
    session: LaunchSession, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Hydra's ``Launcher.launch``: submit every job, return JobReturns in input order."""
    requests = [JobRequest(o, initial_job_idx + i) for i, o in enumerate(job_overrides)]
    with streaming(session):
        slots = session.executor.slot_count
        log.info("Launching %d jobs on %d slots", len(requests), slots)
        keys: list[str] = []
        returns: dict[str, JobReturn] = {}
        # The first chunk fills the idle slots at once; later ones are composed and looked
        # up while those jobs run.
        chunk = max(session.idle_slots, 1)
        while requests:
            keys += [job.key for job in session.submit_batch(requests[:chunk])]
            requests = requests[chunk:]
            chunk = LOOKUP_CHUNK
            returns.update(session.wait_any(timeout=0))
        while len(returns) < len(keys):
            returns.update(session.wait_any())
    return [returns[key] for key in keys]


@contextmanager
def streaming(session: LaunchSession) -> Iterator[None]:
    """Hydra's logging and the sweep dir set up before the first job; on Ctrl-C or SIGTERM
    every job's process group is stopped before the launcher goes; the sweep's run data is
    written when it ends."""
    configure_log(session.config.hydra.hydra_logging, session.config.hydra.verbose)
    Path(str(session.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    session.refresh_context()
    session.submitted = session.skipped = session.skipped_stale = session.elsewhere = 0
    session.in_stream = True
    try:
        yield  # the view starts with the first job that runs (LaunchSession.start_view)
        session.stop_view()
        session.recorder.flush()
        session.summary.pruned(session.tally.snapshot().pruned)
        session.write_summary()
        if session.elsewhere:
            log.info(
                "furcate: %d of %d configs ran in other launchers (their MLflow runs are the "
                "record)",
                session.elsewhere,
                session.submitted,
            )
        if session.skipped:
            log.info(
                "furcate: skipped %d of %d configs already recorded in MLflow",
                session.skipped,
                session.submitted,
            )
        if session.skipped_stale:
            code = session.recorder.code
            log.warning(
                "furcate: %d of the %d skipped configs were finished by other code than this "
                "sweep's (%s); set hydra.launcher.code_change=rerun to run them again",
                session.skipped_stale,
                session.skipped,
                code.key if code is not None else "unknown",
            )
    except ExecutorBrokenError:
        session.stop_view()
        session.close()  # the sweep failed; it was not interrupted
        raise
    except KeyboardInterrupt:
        signum = interrupts.received() or signal.SIGINT
        stopped = session.close(interrupted=True)
        with contextlib.suppress(OSError):  # the summary of what did run, if it can be written
            session.write_summary()
        log.warning(
            "furcate: interrupted (%s): %d job%s stopped and recorded as KILLED, the sweep's "
            "records written to %s; run the same command to resume",
            signal.Signals(signum).name,
            stopped,
            "" if stopped == 1 else "s",
            session.recorder.sweep.sweep_dir,
        )
        # No traceback: the shell's convention for a process ended by a signal
        raise SystemExit(128 + signum) from None
    except BaseException:
        session.close(interrupted=True)
        raise
    finally:
        session.in_stream = False


def _error_text(job: JobRecord, job_return: JobReturn) -> str:
    """Why a job did not finish, in words."""
    if job.state is JobState.COMPLETED:  # the task raised: the exception says why
        error = returned(job_return)
        return f"{type(error).__name__}: {error}"
    return job.error or job.state.value


def _outcome(job: JobRecord, text: str) -> str:
    """How a job that did not finish ended: failed, crashed, killed, preempted, not started."""
    if job.state is JobState.CANCELLED:
        return "killed" if job.started_at is not None else "not started"
    if job.state is JobState.CRASHED:  # killed from outside, or died of a signal
        return "killed" if re.search(r"by SIG(KILL|TERM)\b", text) else "crashed"
    if job.state is JobState.PREEMPTED:  # more often than it may be queued again
        return "preempted"
    return "failed"


def task_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides of the task's config: Hydra's ``filter_overrides`` misses ``+hydra.*`` and
    ``++hydra.*`` (how a sweeper passes a job its environment through any launcher)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]


def _job_config(composer: SweepComposer, request: JobRequest) -> DictConfig:
    sweep_config = composer.compose(request.overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = request.num
        sweep_config.hydra.job.num = request.num
    return sweep_config


def _label(request: JobRequest) -> str:
    return " ".join(task_overrides(request.overrides))


def _name(request: JobRequest) -> str:
    """The job as messages name it: ``job #3 (lr=0.1)``."""
    return f"job #{request.num} ({_label(request) or 'no overrides'})"
