"""The job lifecycle every backend shares: one ``Executor`` over a backend's ``Transport``.

    submit(job) ──► queue ──► transport.has_room()? ──► place(job) ──► held
                      ▲                                                 │ poll(): Started
                      │ RETRYING (crashed, retries left; or out of GPU  │ ──► STARTED
                      │   memory beside others, jobs_per_gpu=auto)      │
                      │ PREEMPTED (stopped from outside, limit left)    │ poll(): Ended
                      └──────────────────────────────────── policy ◄────┘
    wait_any() ◄── done ◄── ENDED: COMPLETED, FAILED, CRASHED, CANCELLED, PREEMPTED, LOST

The pool owns the queue, the jobs held by the transport, the cancelled keys, the broken
state, progress polling and the events; what an ended job becomes (the retry / preemption /
crash / out-of-memory policy) is ``execution.end_policy``'s to decide, and the pool's to
apply. A transport (``execution.transport``) only places jobs on slots and reports what
became of them. Keeps the ``Executor`` contract (``execution.executor``). Nothing here
imports Hydra.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.end_policy import EndPolicy, QueueAgain
from furcate_hydra.execution.executor import EventKind, JobEvent, JobListener
from furcate_hydra.execution.fused_groups import FusedGroups
from furcate_hydra.execution.gpu.packing import GpuPacking
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.transport import (
    Broken,
    Ended,
    Placed,
    Report,
    Started,
    Transport,
    TransportBroken,
)
from furcate_hydra.progress import JobProgress, read_progress

__all__ = ["JobPool"]

log = logging.getLogger(__name__)

# How often running jobs' progress files are looked at, while anyone listens for PROGRESS.
PROGRESS_POLL_S = 1.0
# Longest a wait goes without looking for a Ctrl-C that Python lost (see interrupts.py).
INTERRUPT_CHECK_S = 1.0

_Pool = TypeVar("_Pool", bound="JobPool")


class JobPool:
    """Runs jobs through a transport, each job handed back once (see the module doc)."""

    def __init__(
        self, transport: Transport, options: PoolOptions, packing: GpuPacking | None = None
    ) -> None:
        """``packing``: for GPU slots, what opens and closes them (the transport's slot book
        asks it too); a job that ran out of GPU memory is its to judge."""
        self.options = options
        self.packing = packing
        self._policy = EndPolicy(options, packing)  # what an ended job becomes
        self._transport = transport
        self._queue: collections.deque[Job] = collections.deque()
        self._held: dict[str, Job] = {}  # placed: on a slot, or ahead of one
        self._started: set[str] = set()  # held jobs whose STARTED was told
        self._cancelled: set[str] = set()
        self._done: list[Job] = []
        self._listeners: list[JobListener] = []
        self._progress_seen: dict[str, int] = {}  # job key -> mtime_ns of its progress file
        self._progress_polled = 0.0
        self._broken: str | None = None
        self._closed = False
        # fuse=auto: queued jobs start in groups, whose fits train as one
        self._groups = FusedGroups.for_pool(options, transport.slot_count)
        self._submitting = False  # a caller is queueing jobs: a group may wait for more

    # -- the Executor contract ---------------------------------------------------------

    @property
    def slot_count(self) -> int:
        if self._groups is not None:  # a learned width opens as many seats as it is wide
            return self._groups.seats_open(self._transport.slot_count)
        return self._transport.slot_count

    @property
    def idle_slots(self) -> int:
        if self._groups is not None:  # a slot another group holds has none for a new one
            return self._groups.seats_free(self._transport.idle_slots)
        return self._transport.idle_slots

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._held) + len(self._done)

    def describe(self) -> str:
        return self._transport.describe()

    def start(self) -> None:
        self._transport.start()

    def wait_ready(self) -> None:
        self._transport.wait_ready()

    def add_listener(self, listener: JobListener) -> None:
        self._listeners.append(listener)

    def preload(self, modules: Sequence[str]) -> None:
        if self._broken is None:
            self._call(self._transport.preload, modules)

    @property
    def learned_imports(self) -> tuple[str, ...]:
        return self._transport.learned_imports

    def set_context(self, context: bytes) -> None:
        if self._broken is None:
            self._call(self._transport.set_context, context)

    def submit(self, job: Job) -> None:
        """Queue a job.

        Raises:
            ExecutorBrokenError: the pool is broken.
            ValueError: a job of the same key is queued or running.
        """
        if self._broken is not None:
            raise ExecutorBrokenError(
                f"Job {job.name} cannot start: the {self._transport.name} is broken "
                f"({self._broken}). Every job it held was recorded as failed; start the sweep "
                "again to run what is left (finished configs are skipped)."
            )
        if job.key in self._held or any(queued.key == job.key for queued in self._queue):
            raise ValueError(f"job key {job.key!r} is already queued or running")
        self._transport.wait_ready()
        job.state = JobState.QUEUED
        self._queue.append(job)
        self._submitting = True
        try:
            self._dispatch()
            # Take in jobs that ended meanwhile, so a caller busy submitting (composing
            # configs) does not leave their slots idle until it next waits.
            while self._broken is None and (reports := self._poll(0)):
                self._handle(reports)
        finally:
            self._submitting = False

    def wait_any(self, timeout: float | None = None) -> list[Job]:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._groups is not None:
            self._dispatch()  # the caller submits no more for now: a smaller group may start
        while not self._done and (self._held or self._queue):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            if self._listeners and self._running():  # wake up for the next progress poll
                due = max(0.0, self._progress_polled + PROGRESS_POLL_S - time.monotonic())
                remaining = due if remaining is None else min(remaining, due)
            interrupts.check()
            # never block for long: a Ctrl-C Python lost is raised at the next check
            remaining = (
                INTERRUPT_CHECK_S if remaining is None else min(remaining, INTERRUPT_CHECK_S)
            )
            self._handle(self._poll(remaining))
            if self.packing is not None and self.packing.take_growth():
                self._dispatch()  # a GPU opened a slot: its memory has room for one more job
            self._poll_progress()
        done, self._done = self._done, []
        return done

    def cancel(self, keys: Iterable[str]) -> None:
        for key in keys:
            for job in list(self._queue):
                if job.key == key:
                    self._queue.remove(job)
                    self._finish(job, JobState.CANCELLED, error="cancelled before it started")
            held = self._held.get(key)
            if held is not None and self._broken is None:
                self._cancelled.add(key)  # back as CANCELLED when its process has ended
                self._call(self._transport.stop, held)

    def close(self) -> None:
        """Stop every job still running and the transport's machinery; idempotent."""
        if self._closed:
            return
        self._closed = True
        running = len(self._running())
        if running and self._broken is None:
            log.warning("Stopping %d running job(s) of the %s", running, self._transport.name)
        self._transport.close()
        if self._groups is not None:
            self._groups.close()

    # -- conveniences --------------------------------------------------------------------

    def as_completed(self) -> Iterator[Job]:
        while self.pending:
            yield from self.wait_any()

    def run_all(self, jobs: Sequence[Job]) -> list[Job]:
        """Submit every job, wait for all of them, return them in input order."""
        for job in jobs:
            self.submit(job)
        by_key = {job.key: job for job in self.as_completed()}
        return [by_key[job.key] for job in jobs]

    def __enter__(self: _Pool) -> _Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the transport -------------------------------------------------------------------

    def _call(self, hook: Any, *args: Any) -> None:
        try:
            hook(*args)
        except TransportBroken as exc:
            self._break(exc.reason)

    def _poll(self, timeout: float) -> list[Report]:
        try:
            return self._transport.poll(timeout)
        except TransportBroken as exc:
            return [Broken(exc.reason)]

    def _handle(self, reports: list[Report]) -> None:
        """Take in what the transport reports; a job's end or a freed slot places queued jobs
        (a job's start does not: a job queued again after it goes first, see ``_queue_again``)."""
        room = False
        for report in reports:
            if self._broken is not None:
                return
            if isinstance(report, Broken):
                self._break(report.reason)
            elif isinstance(report, Started):
                self._on_started(report)
            elif isinstance(report, Ended):
                self._on_ended(report)
                room = True
            else:
                room = True
        if room:
            self._dispatch()

    def _dispatch(self) -> None:
        """Place queued jobs, oldest first, while the transport has room (with ``fuse``: a
        group at a time, see ``FusedGroups.take``)."""
        if self._groups is not None:
            self._dispatch_groups(self._groups)
            return
        while self._queue and self._broken is None:
            try:
                if not self._transport.has_room():
                    return
                job = self._queue.popleft()
            except TransportBroken as exc:
                self._break(exc.reason)
                return
            self._place(job)

    def _dispatch_groups(self, groups: FusedGroups) -> None:
        while self._queue and self._broken is None:
            group = groups.take(
                self._queue,
                self._transport.idle_slots,
                more_may_come=self._submitting,
                running=bool(self._held),
            )
            if not group:
                return
            for job in group:
                self._place(job)

    def _place(self, job: Job) -> None:
        if self._broken is not None:  # an earlier job of its group broke the transport
            self._finish(job, JobState.LOST, error=f"{self._broken}\n{job.paths.see_logs()}")
            return
        job.attempts += 1
        # of an attempt that crashed or was preempted, if this is another
        job.pid = job.started_at = job.ended_at = None
        try:
            job.paths.output_dir.mkdir(parents=True, exist_ok=True)
            self._policy.placing(job)
            self._held[job.key] = job
            placed = self._transport.place(job)
        except TransportBroken as exc:
            self._break(exc.reason)
            return
        if placed is not None:
            self._occupy(job, placed)

    def _break(self, reason: str) -> None:
        """The machinery died: every job held here is LOST, with the reason; no more submits."""
        if self._broken is not None:
            return
        self._broken = reason
        log.error("furcate: the %s is broken: %s", self._transport.name, reason)
        self._transport.abandon()
        for job in [*self._held.values(), *self._queue]:
            self._finish(job, JobState.LOST, error=f"{reason}\n{job.paths.see_logs()}")
        self._held.clear()
        self._queue.clear()
        self._started.clear()

    # -- what happened to a job ------------------------------------------------------------

    def _occupy(self, job: Job, placed: Placed) -> None:
        job.slot, job.node, job.state = placed.slot, placed.node, JobState.RUNNING
        if self.packing is not None and placed.slot.device is not None:
            self.packing.started(job.key, placed.slot.device)

    def _running(self) -> list[Job]:
        return [job for job in self._held.values() if job.state is JobState.RUNNING]

    def _on_started(self, report: Started) -> None:
        job = self._held.get(report.key)
        if job is None:
            return  # it ended meanwhile
        if report.placed is not None:  # it leaves its gate for a slot
            self._occupy(job, report.placed)
        job.pid, job.started_at = report.pid, report.started_at
        if job.key not in self._started:
            self._started.add(job.key)
            self._emit(EventKind.STARTED, job)

    def _on_ended(self, ended: Ended) -> None:
        job = self._held.pop(ended.key, None)
        if job is None:
            return
        if self._groups is not None:
            self._groups.ended(job)
        self._started.discard(job.key)
        if ended.ended_at is not None:
            job.ended_at = ended.ended_at
        cancelled = job.key in self._cancelled
        self._cancelled.discard(job.key)
        outcome = self._policy.outcome(job, ended, cancelled, may_retry=self._broken is None)
        if isinstance(outcome, QueueAgain):
            self._queue_again(job, outcome.kind, outcome.why)
        elif outcome.state is JobState.COMPLETED:
            self._finish(job, outcome.state, value=outcome.value)
        else:
            self._finish(job, outcome.state, error=outcome.error)
        self._policy.ended(job, ended.report)

    def _queue_again(self, job: Job, kind: EventKind, why: str) -> None:
        """A retried or preempted job goes back first in the queue (it ran before any queued
        job), told to the listeners as ``kind``."""
        job.state = JobState.QUEUED
        self._queue.appendleft(job)
        self._emit(kind, job, why)

    def _finish(self, job: Job, state: JobState, **fields: Any) -> None:
        self._progress_seen.pop(job.key, None)
        job.state = state
        for name, value in fields.items():
            setattr(job, name, value)
        if job.ended_at is None:
            job.ended_at = time.time()
        self._done.append(job)
        self._emit(EventKind.ENDED, job)

    def _poll_progress(self) -> None:
        """A PROGRESS event for each running job whose progress file changed."""
        now = time.monotonic()
        if not self._listeners or now - self._progress_polled < PROGRESS_POLL_S:
            return
        self._progress_polled = now
        for job in self._running():
            try:
                mtime = job.paths.progress.stat().st_mtime_ns
            except OSError:
                continue  # nothing reported yet (or the job's node does not share this disk)
            if self._progress_seen.get(job.key) == mtime:
                continue
            progress = read_progress(job.paths.progress)
            if progress is not None and (job.started_at or 0) <= progress.at:
                self._progress_seen[job.key] = mtime
                job.progress = progress
                self._emit(EventKind.PROGRESS, job, progress=progress)

    def _emit(
        self,
        kind: EventKind,
        job: Job,
        detail: str = "",
        progress: JobProgress | None = None,
    ) -> None:
        event = JobEvent(kind, job, detail, progress)
        for listener in self._listeners:
            listener(event)
