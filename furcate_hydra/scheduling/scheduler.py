"""What runs when: a batch of composed jobs dispatched, the jobs in flight, what comes back.

submit(jobs) ──► fail_fast stopped the sweep? every job CANCELLED, "not started": ready
             ──► ledger: one decision per job (one store lookup) ──► claims (one more)
                 SKIP / REPORT_FAILURE ──► ledger.open gives its result: ready (counted
                                            skipped, or ran elsewhere)
                 ELSEWHERE ──► followed: the run another launcher holds
                 RUN / RESUME ──► ledger.open (its run) ──► executor.submit: in flight
wait_any ──► ready results first, then the executor's ended jobs (each turned into a result by
             the handler), and every ELSEWHERE_POLL_S one lookup of the runs held elsewhere:
             ended there ──► ready; let go there ──► dispatched again
ended_badly / failed(job) ──► fail_fast: queued jobs cancelled, later ones never started

Hydra-free: a result is whatever the handler and the ledger make of a job (the launcher's are
Hydra's JobReturns), opaque here. Every submitted job is handed back once, as ``(key, result)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.executor import Executor
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.store.decisions import Action, Decision
from furcate_hydra.store.run_record import RunRecord

log = logging.getLogger(__name__)

__all__ = ["ELSEWHERE_POLL_S", "Handler", "Ledger", "Scheduler", "StreamCounts"]

# How often the store is asked about configs other launchers hold (one lookup for all of them).
ELSEWHERE_POLL_S = 1.0

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Ledger(Protocol[R_co]):
    """The store's side of scheduling: decide, claim, open, follow (the launcher's run ledger)."""

    @property
    def decides_without_store(self) -> bool:
        """Whether ``prepare`` may decide before the store is opened."""
        ...

    def prepare(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Fingerprint a batch and decide it; None when the store must be opened first."""
        ...

    def decide(self, jobs: Sequence[Job]) -> list[Decision] | None:
        """Decide a prepared batch again (one lookup)."""
        ...

    def needs_store(self, decisions: Sequence[Decision]) -> bool:
        """Whether these decisions write into the store."""
        ...

    def claim(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> list[Decision]:
        """Claim the configs to run; a lost claim becomes ELSEWHERE."""
        ...

    def open(self, job: Job, decision: Decision) -> R_co | None:
        """The result of a job that does not run (SKIP, REPORT_FAILURE), or None once its run
        is open and it may be submitted."""
        ...

    def follow(self, waiting: Sequence[RunRecord]) -> list[Decision | None]:
        """For runs held elsewhere: None while one still runs, else what to do with its job."""
        ...

    def holder(self, record: RunRecord) -> str:
        """Which launcher holds a run, in words."""
        ...

    def flush(self, force: bool = True) -> None:
        """Write what was recorded of ended jobs (at most every few seconds unless forced)."""
        ...


class Handler(Protocol[R]):
    """What the scheduler's owner makes of jobs: warming up, results, the view."""

    def warm_up(self) -> bool:
        """Start what running a job needs (once); True if it started now."""
        ...

    def start_view(self) -> None:
        """A job is about to run: show the progress view."""
        ...

    def submitting(self, job: Job) -> None:
        """The job is about to go to the executor (its payload, the tally)."""
        ...

    def not_run(self, job: Job, result: R) -> None:
        """A job not run (skipped, or a failure reported), with its ledger's result."""
        ...

    def finished(self, job: Job) -> R:
        """A job the executor handed back (or lost): its result, recorded."""
        ...

    def not_started(self, job: Job) -> R:
        """A job never started (fail_fast stopped the sweep): its result."""
        ...


@dataclass
class StreamCounts:
    """What one stream of submits did, for its closing log lines.

    Attributes:
        submitted: Jobs submitted.
        skipped: Jobs skipped, their config recorded FINISHED (or failed, reported) before.
        skipped_other_code: Of those, the ones another code version finished.
        ran_elsewhere: Jobs that ran in another launcher while this one waited.
    """

    submitted: int = 0
    skipped: int = 0
    skipped_other_code: int = 0
    ran_elsewhere: int = 0


class Scheduler(Generic[R]):
    """Jobs dispatched onto an executor, decided by a ledger, turned into results by a handler.

    One thread owns it, as it owns the executor. Holds each job from ``submit`` until
    ``wait_any`` hands it back (or ``close`` gives it up), and nothing of it after that.
    """

    def __init__(
        self, executor: Executor, ledger: Ledger[R], handler: Handler[R], fail_fast: bool
    ) -> None:
        self.executor = executor
        self.ledger = ledger
        self.handler = handler
        self.fail_fast = fail_fast
        self.counts = StreamCounts()
        self.stopped_by: str | None = None  # why no more jobs start (fail_fast)
        self._stopped_note: tuple[int, int] | None = None  # queued and running jobs then
        self._jobs: dict[str, Job] = {}  # submitted, not yet handed back
        self._ready: list[tuple[str, R]] = []  # not run: handed back at the next wait
        # held by other launchers: the job and the run it waits for
        self._elsewhere: dict[str, tuple[Job, RunRecord]] = {}
        self._next_follow = 0.0

    def new_stream(self) -> StreamCounts:
        """Count a new stream of submits from zero; returns its counts."""
        self.counts = StreamCounts()
        return self.counts

    @property
    def in_flight(self) -> list[Job]:
        """Jobs submitted to the executor and not yet handed back."""
        return list(self._jobs.values())

    def held_elsewhere(self, key: str) -> RunRecord | None:
        """The run another launcher holds for this job, while it waits for it."""
        held = self._elsewhere.get(key)
        return held[1] if held is not None else None

    def submit(self, jobs: Sequence[Job]) -> None:
        """Decide (one store lookup for the batch), claim (one more) and dispatch jobs."""
        if not self.ledger.decides_without_store:
            self.handler.warm_up()  # the lookup needs the store, and the server is forked first
        if self.stopped_by is not None:
            for job in jobs:  # never started, never recorded: a rerun runs them
                self.counts.submitted += 1
                job.state, job.error = JobState.CANCELLED, f"not started: {self.stopped_by}"
                self._ready.append((job.key, self.handler.not_started(job)))
            return
        self.counts.submitted += len(jobs)
        decisions = self.ledger.prepare(jobs)
        if decisions is None:  # only MLflow can read this store: open it first
            self.handler.warm_up()
            decisions = self.ledger.decide(jobs)
            assert decisions is not None
        self._dispatch(jobs, decisions)

    def _dispatch(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> None:
        if self.ledger.needs_store(decisions) or any(
            d.action not in (Action.SKIP, Action.REPORT_FAILURE) for d in decisions
        ):
            if self.handler.warm_up():
                # Loading MLflow took seconds since the lookup: another launcher may have
                # claimed, or even finished, some of these configs meanwhile, and a claim only
                # sees RUNNING rivals. Decide again, now, before claiming.
                decisions = self.ledger.decide(jobs) or decisions
            self.handler.start_view()
        decisions = self.ledger.claim(jobs, decisions)
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
                    self.ledger.holder(decision.record),
                    decision.record.run_id,
                )
                continue
            # Each job is handed to the executor as soon as its run exists, not after the batch.
            result = self.ledger.open(job, decision)
            if result is not None:
                if decision.ran_elsewhere:
                    self.counts.ran_elsewhere += 1
                    log.info("\t#%d : %s (ran elsewhere: run %s)", job.num, job.label, job.run_id)
                else:
                    self.counts.skipped += 1
                    self.counts.skipped_other_code += decision.other_code
                    log.info("\t#%d : %s (skipped: run %s)", job.num, job.label, job.run_id)
                self._ready.append((job.key, result))
                self.handler.not_run(job, result)
                continue
            log.info("\t#%d : %s", job.num, job.label)
            self.handler.submitting(job)
            try:
                self.executor.submit(job)
            except ExecutorBrokenError as exc:
                # Its run is open: record it failed, with why, before the error goes on.
                job.state, job.error = JobState.LOST, str(exc)
                self.handler.finished(job)
                raise
            self._jobs[job.key] = job

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, R]]:
        """Jobs that ended: here, or (held elsewhere) in another launcher; at least one unless
        ``timeout`` passed or nothing is in flight."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._elsewhere and time.monotonic() >= self._next_follow:
                self._follow()
            if self._ready:
                ready, self._ready = self._ready, []
                return ready + [(j.key, self._hand_back(j)) for j in self.executor.wait_any(0)]
            now = time.monotonic()
            wait = None if deadline is None else max(0.0, deadline - now)
            if self._elsewhere:
                due = max(0.0, self._next_follow - now)
                wait = due if wait is None else min(wait, due)
            if self.executor.pending:
                results = [(j.key, self._hand_back(j)) for j in self.executor.wait_any(wait)]
                self.ledger.flush(force=False)
                if results:
                    return results
            elif self._elsewhere and wait:
                interrupts.check()
                time.sleep(min(wait, ELSEWHERE_POLL_S))
            if not self._elsewhere and not self.executor.pending:
                return []
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _hand_back(self, job: Job) -> R:
        self._jobs.pop(job.key, None)
        return self.handler.finished(job)

    def _follow(self) -> None:
        """One lookup for every config held elsewhere: those that ended there are ready, with
        that run's outcome; those let go (stopped, their launcher gone) are decided again."""
        waiting = list(self._elsewhere.values())
        again: list[tuple[Job, Decision]] = []
        for (job, _), decision in zip(
            waiting, self.ledger.follow([r for _, r in waiting]), strict=True
        ):
            if decision is None:
                continue
            del self._elsewhere[job.key]
            again.append((job, decision))
        if again:
            self._dispatch([j for j, _ in again], [d for _, d in again])
        self._next_follow = time.monotonic() + ELSEWHERE_POLL_S

    def ended_badly(self, job: Job, how: str) -> None:
        """A job just ended otherwise than finished (``how``: failed, crashed, killed, ...):
        under fail_fast, stop starting jobs at once, before the executor gives its slot the
        next one. Said once the job is handed back (``failed``)."""
        if self.fail_fast and self.stopped_by is None:
            self._stop_starting(job, how)

    def failed(self, job: Job, how: str) -> None:
        """A job handed back that did not finish (``how``), never-started ones aside: under
        fail_fast, no more jobs start, and the log says so after the job that made it stop."""
        self.ended_badly(job, how)
        if self._stopped_note is not None:
            log.warning(
                "furcate: fail_fast: %d queued job(s) and any the sweeper submits are not "
                "started; the %d running one(s) finish",
                *self._stopped_note,
            )
            self._stopped_note = None

    def _stop_starting(self, job: Job, how: str) -> None:
        """The jobs queued are cancelled, and any submitted later not started."""
        self.stopped_by = f"hydra.launcher.fail_fast after job #{job.num} {how}"
        queued = [key for key, held in self._jobs.items() if held.state is JobState.QUEUED]
        self.executor.cancel(queued)
        running = sum(1 for held in self._jobs.values() if held.state is JobState.RUNNING)
        self._stopped_note = (len(queued), running)

    def give_up(self) -> list[Job]:
        """Forget every job in flight or followed (the executor closed): the jobs it held."""
        held = list(self._jobs.values())
        self._jobs.clear()
        self._elsewhere.clear()  # nothing of this launcher's: the other one records them
        return held
