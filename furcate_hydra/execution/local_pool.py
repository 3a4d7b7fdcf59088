"""The local executor: slots on this machine, each job a fresh process forked from a warm server.

    submit(job) ──► queue ──► free slot? ──► Start(slot) ──► fork server ──► job process
                                │ no: ahead of the slots, one per slot ──► Start(no slot):
                                │     forked now, set up, waiting at its gate
                                ▼                                           │ a job exits
    wait_any() ◄── JobRecord ◄── result file / exit status ◄── Exited ◄─────┘ its slot goes to
                                  └── slot freed (or, in the server, handed to the oldest job
                                      waiting at its gate: Started(after=...)), next dispatched

The fork server starts (``start``) when the first job needs it, or before, so that it loads
while the caller does other work (``wait_ready`` then waits for it).

Used synchronously (``run_all``: submit everything, records in input order) or asynchronously
(``submit`` then ``wait_any``), which is how the sweepers keep every slot busy. Keeps the
``Executor`` contract (``furcate_hydra.execution.executor``): one owner thread, every job back
once, a dead fork server breaks the pool loudly. Nothing here imports Hydra.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from furcate_hydra.errors import ExecutorBrokenError, ForkServerError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.executor import EventKind, JobEvent, JobListener
from furcate_hydra.execution.exits import describe_wait_status
from furcate_hydra.execution.forkserver import ChildReport, ForkServerClient
from furcate_hydra.execution.forkserver.client import ConsoleOutput, start_server
from furcate_hydra.execution.forkserver.protocol import (
    Exited,
    Placement,
    Start,
    Started,
    StartFailed,
    Unused,
    WarmContext,
)
from furcate_hydra.execution.job import JobRecord, JobState
from furcate_hydra.execution.slot_book import SlotBook
from furcate_hydra.execution.slots import Slot, SlotPlan
from furcate_hydra.preemption import PREEMPTION_SIGNALS
from furcate_hydra.progress import JobProgress, read_progress

__all__ = ["LocalPool", "PoolOptions"]

log = logging.getLogger(__name__)

# How often running jobs' progress files are looked at, while anyone listens for PROGRESS.
PROGRESS_POLL_S = 1.0
# Longest a wait goes without looking for a Ctrl-C that Python lost (see interrupts.py).
INTERRUPT_CHECK_S = 1.0


@dataclass(frozen=True)
class PoolOptions:
    """How the pool treats its jobs (``hydra.launcher`` keys of the same names)."""

    # re-run a job whose process crashed (not one that raised) up to this many times
    max_retries: int
    # queue a preempted job again (it was stopped from outside, not by the pool) this often
    max_preemptions: int
    # modules the fork server imports once so that jobs start warm; None: those the
    # launcher's process has loaded (a forked server has them already)
    preload: tuple[str, ...] | None
    # copy each job's stdout/stderr onto the launcher's console as well as its log files
    echo_output: bool
    # time a stopped job gets between SIGTERM and SIGKILL
    stop_grace_s: float
    # fork a job per busy slot ahead, handed the slot the moment its job ends; off where no
    # job may start after a failure (fail_fast): the server cannot tell a failed job's end
    fork_ahead: bool = True


class LocalPool:
    """Runs jobs on the slots of a plan, one fresh process per job."""

    def __init__(
        self,
        plan: SlotPlan,
        context: bytes,
        options: PoolOptions,
        output: ConsoleOutput | None = None,
        warm: Callable[[], WarmContext | None] | None = None,
    ) -> None:
        """``context``: what every job starts from, pickled. ``warm``: asked when the server
        starts, for what a fork of this process starts jobs from, as it is at the fork (so it
        must not hold state a later ``set_context`` changes); None, or it answers None: start
        a new interpreter. ``output``: where job output echoed to the console goes (default:
        the launcher's stdout and stderr)."""
        self.plan = plan
        self.options = options
        self._context = context
        self._warm = warm
        self._output = output
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="furcate-"))
        self._server: ForkServerClient | None = None
        self._slots = SlotBook(plan.slots)
        self._queue: collections.deque[JobRecord] = collections.deque()
        self._running: dict[str, JobRecord] = {}
        self._ahead: dict[str, JobRecord] = {}  # forked ahead, waiting at their gates for a slot
        self._cancelled: set[str] = set()
        self._done: list[JobRecord] = []
        self._listeners: list[JobListener] = []
        self._progress_seen: dict[str, int] = {}  # job key -> mtime_ns of its progress file
        self._progress_polled = 0.0
        self._broken: str | None = None
        self._closed = False

    # -- the Executor contract ---------------------------------------------------------

    @property
    def slot_count(self) -> int:
        return len(self.plan.slots)

    @property
    def idle_slots(self) -> int:
        return self._slots.free

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._ahead) + len(self._running) + len(self._done)

    @property
    def server_start_s(self) -> float:
        """Seconds from starting the fork server to its having loaded everything."""
        return self._ready_server().start_s

    @property
    def server_pid(self) -> int:
        return self._started_server().process.pid

    @property
    def server_forked(self) -> bool:
        """Whether the fork server is a fork of this process (else a fresh interpreter)."""
        return self._started_server().forked

    def start(self) -> None:
        """Start the fork server, if not yet; it loads what it needs while this returns."""
        self._started_server()

    def wait_ready(self) -> None:
        """Start the fork server if needed and wait until it can fork jobs.

        Raises:
            ForkServerError: it could not load the task (its traceback says why).
        """
        self._ready_server()

    def describe(self) -> str:
        return self.plan.describe()

    def add_listener(self, listener: JobListener) -> None:
        self._listeners.append(listener)

    def set_context(self, context: bytes) -> None:
        if self._server is None:  # a new interpreter starts from it (a fork, from itself)
            self._context = context
        elif self._broken is None:
            self._send(lambda: self._ready_server().set_context(context))

    def submit(self, job: JobRecord) -> None:
        """Queue a job. Raises ExecutorBrokenError once the fork server is gone."""
        if self._broken is not None:
            raise ExecutorBrokenError(
                f"Job {job.name} cannot start: the local slot pool is broken ({self._broken}). "
                "Every job it held was recorded as failed; start the sweep again to run "
                "what is left (finished configs are skipped)."
            )
        held = (*self._running, *self._ahead, *(queued.key for queued in self._queue))
        if job.key in held:
            raise ValueError(f"job key {job.key!r} is already queued or running")
        self._ready_server()
        job.state = JobState.QUEUED
        self._queue.append(job)
        self._dispatch()
        # Take in jobs that ended meanwhile, so a caller busy submitting (composing configs)
        # does not leave their slots idle until it next waits.
        self._drain_events()

    def wait_any(self, timeout: float | None = None) -> list[JobRecord]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done and (self._running or self._ahead or self._queue):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            if self._listeners and self._running:  # wake up for the next progress poll
                due = max(0.0, self._progress_polled + PROGRESS_POLL_S - time.monotonic())
                remaining = due if remaining is None else min(remaining, due)
            interrupts.check()
            # never block for long: a Ctrl-C Python lost is raised at the next check
            remaining = (
                INTERRUPT_CHECK_S if remaining is None else min(remaining, INTERRUPT_CHECK_S)
            )
            event = self._receive(remaining)
            if event is not None:
                self._on_event(event)
            self._poll_progress()
        done, self._done = self._done, []
        return done

    def cancel(self, keys: Iterable[str]) -> None:
        for key in keys:
            for job in list(self._queue):
                if job.key == key:
                    self._queue.remove(job)
                    self._finish(job, JobState.CANCELLED, error="cancelled before it started")
            if (key in self._running or key in self._ahead) and self._broken is None:
                self._cancelled.add(key)  # back as CANCELLED when its process has exited
                self._send(lambda key=key: self._ready_server().kill(key, signal.SIGTERM))

    def close(self) -> None:
        """Stop every job's process group and the fork server; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._running and self._broken is None:
            log.warning("Stopping %d running job(s)", len(self._running))
        if self._server is not None and self._server.ready is None:
            # still loading (seconds of imports), with no job: it would not read a Shutdown
            self._server.terminate(wait_s=0.0)
        elif self._server is not None:
            self._server.shutdown(self.options.stop_grace_s)
        shutil.rmtree(self._runtime_dir, ignore_errors=True)

    # -- conveniences --------------------------------------------------------------------

    def as_completed(self) -> Iterator[JobRecord]:
        while self.pending:
            yield from self.wait_any()

    def run_all(self, jobs: Sequence[JobRecord]) -> list[JobRecord]:
        """Submit every job, wait for all of them, return them in input order."""
        for job in jobs:
            self.submit(job)
        by_key = {job.key: job for job in self.as_completed()}
        return [by_key[job.key] for job in jobs]

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the fork server -----------------------------------------------------------------

    def _started_server(self) -> ForkServerClient:
        if self._server is None:
            preload, output = self.options.preload, self._output
            warm = self._warm() if self._warm is not None else None
            self._server = start_server(preload, self._context, warm, output)
        return self._server

    def _ready_server(self) -> ForkServerClient:
        server = self._started_server()
        server.wait_ready()
        return server

    def _receive(self, timeout: float | None) -> object | None:
        if self._server is None:
            return None
        try:
            return self._server.receive(timeout=timeout)
        except ForkServerError as exc:
            self._break(str(exc))
            return None

    def _drain_events(self) -> None:
        while self._broken is None and (event := self._receive(0)) is not None:
            self._on_event(event)

    def _send(self, request: Any) -> None:
        try:
            request()
        except OSError as exc:  # BrokenPipeError and kin: the server is gone
            self._break(f"the fork server stopped taking requests ({exc!r})")

    def _break(self, reason: str) -> None:
        """The fork server died: every job held here is LOST, with the reason; no more submits.

        Its jobs run in sessions of their own, so they outlive it: stop them, as it would have.
        """
        if self._broken is not None:
            return
        self._broken = reason
        log.error("furcate: the local slot pool is broken: %s", reason)
        for job in list(self._running.values()):
            if job.pid is not None:
                _kill_group(job.pid)
        # those forked ahead exit by themselves: their gates closed with the server
        for job in [*self._running.values(), *self._ahead.values(), *self._queue]:
            self._finish(job, JobState.LOST, error=f"{reason}\n{job.paths.see_logs()}")
        self._running.clear()
        self._ahead.clear()
        self._queue.clear()
        self._slots.clear()

    # -- internals -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Fill free slots (jobs forked ahead first), then fork one job ahead per busy slot."""
        slots = self._slots
        while self._broken is None:
            if slots.free and len(self._ahead) > slots.offered:
                slot = slots.offer()
                self._send(lambda slot=slot: self._ready_server().release(_placement(slot)))
            elif slots.free and self._queue:
                self._fork(self._queue.popleft(), slots.take_free())
            elif self.options.fork_ahead and self._queue and len(self._ahead) < self.slot_count:
                job = self._queue.popleft()
                self._ahead[job.key] = job
                self._fork(job, None)
            else:
                return

    def _fork(self, job: JobRecord, slot: Slot | None) -> None:
        """Have the server fork the job: on ``slot``, or ahead of one (None)."""
        job.attempts += 1
        job.started_at = job.ended_at = None  # of an attempt that crashed, if a retry
        job.paths.output_dir.mkdir(parents=True, exist_ok=True)
        if slot is not None:
            self._slots.hold(job.key, slot)
            self._occupy(job, slot)
        start = Start(
            key=job.key,
            payload=job.payload,
            env=job.env,
            placement=None if slot is None else _placement(slot),
            stdout_path=str(job.paths.stdout),
            stderr_path=str(job.paths.stderr),
            result_path=str(self._result_path(job)),
            echo=self.options.echo_output,
        )
        self._send(lambda start=start: self._ready_server().start(start))

    def _occupy(self, job: JobRecord, slot: Slot) -> None:
        job.slot, job.state = slot, JobState.RUNNING
        self._running[job.key] = job

    def _on_event(self, event: object) -> None:
        if isinstance(event, Started):
            ahead = self._ahead.pop(event.key, None)
            if ahead is not None:  # it leaves its gate for a slot
                if event.after is not None:  # the slot of a job that ended
                    slot = self._slots.hand_on(event.after, event.key)
                else:
                    slot = self._slots.accept(event.slot, event.key)
                self._occupy(ahead, slot)
            job = self._running[event.key]
            job.pid, job.started_at = event.pid, event.started_at
            self._emit(EventKind.STARTED, job)
        elif isinstance(event, Unused):  # the job it was offered to has gone meanwhile
            self._slots.decline(event.slot)
            self._dispatch()
        elif isinstance(event, StartFailed):
            job = self._take(event.key)
            self._release(job, JobState.FAILED, error=event.error)
        elif isinstance(event, Exited):
            job = self._take(event.key)
            job.ended_at = event.ended_at
            self._on_exit(job, event.wait_status)

    def _take(self, key: str) -> JobRecord:
        """A job that ended: it ran on a slot, or it never left its gate."""
        job = self._running.pop(key, None)
        return job if job is not None else self._ahead.pop(key)

    def _on_exit(self, job: JobRecord, wait_status: int) -> None:
        report = self._read_report(job)
        see_logs = f"\n{job.paths.see_logs()}"
        preempted = _preempted(report, wait_status)
        if job.key in self._cancelled:
            # the pool's own SIGTERM, though the job may have saved and said "preempted"
            self._cancelled.discard(job.key)
            if job.started_at is None:  # stopped at its gate: it never ran
                self._release(job, JobState.CANCELLED, error="cancelled before it started")
            else:
                self._release(job, JobState.CANCELLED, error="stopped by the launcher")
        elif preempted is not None:
            self._on_preempted(job, preempted)
        elif report is not None and report.error is None:
            self._release(job, JobState.COMPLETED, value=report.value)
        elif report is not None:
            self._release(job, JobState.FAILED, error=f"{report.error}{see_logs}")
        elif job.attempts - job.preemptions <= self.options.max_retries:
            why = describe_wait_status(wait_status)
            log.warning(
                "Job %s crashed (%s); retry %d of %d",
                job.label or job.key,
                why,
                job.attempts,
                self.options.max_retries,
            )
            self._queue_again(job, EventKind.RETRYING, why)
        else:
            error = f"{describe_wait_status(wait_status)}{see_logs}"
            self._release(job, JobState.CRASHED, error=error)

    def _queue_again(self, job: JobRecord, kind: EventKind, why: str) -> None:
        """A retried or preempted job goes back first in the queue (it ran before any queued
        job), told to the listeners as ``kind``."""
        self._free_slot(job)
        job.state = JobState.QUEUED
        self._queue.appendleft(job)
        self._emit(kind, job, why)
        self._dispatch()

    def _on_preempted(self, job: JobRecord, why: str) -> None:
        """Queue a preempted job again (first: it ran before any queued job), or, past the
        limit, hand it back PREEMPTED."""
        job.preemptions += 1
        limit = self.options.max_preemptions
        if job.preemptions > limit:
            error = (
                f"preempted {job.preemptions} times, more than hydra.launcher.max_preemptions="
                f"{limit} allows (the last time: {why}); run the same command to resume it"
                f"\n{job.paths.see_logs()}"
            )
            self._release(job, JobState.PREEMPTED, error=error)
            return
        log.warning(
            "Job %s %s; queued again to resume (preemption %d of %d)",
            job.label or job.key,
            why,
            job.preemptions,
            limit,
        )
        self._queue_again(job, EventKind.PREEMPTED, why)

    def _poll_progress(self) -> None:
        """A PROGRESS event for each running job whose progress file changed."""
        now = time.monotonic()
        if not self._listeners or now - self._progress_polled < PROGRESS_POLL_S:
            return
        self._progress_polled = now
        for job in list(self._running.values()):
            try:
                mtime = job.paths.progress.stat().st_mtime_ns
            except OSError:
                continue  # nothing reported yet
            if self._progress_seen.get(job.key) == mtime:
                continue
            progress = read_progress(job.paths.progress)
            if progress is not None and (job.started_at or 0) <= progress.at:
                self._progress_seen[job.key] = mtime
                job.progress = progress
                self._emit(EventKind.PROGRESS, job, progress=progress)

    def _read_report(self, job: JobRecord) -> ChildReport | None:
        path = self._result_path(job)
        if not path.exists():
            return None
        try:
            report = cloudpickle.loads(path.read_bytes())
        except Exception as exc:
            return ChildReport(error=f"the job's result could not be unpickled: {exc!r}")
        finally:
            path.unlink(missing_ok=True)
        return report if isinstance(report, ChildReport) else None

    def _release(self, job: JobRecord, state: JobState, **fields: Any) -> None:
        self._free_slot(job)
        self._finish(job, state, **fields)
        self._dispatch()

    def _free_slot(self, job: JobRecord) -> None:
        self._slots.release(job.key)

    def _finish(self, job: JobRecord, state: JobState, **fields: Any) -> None:
        self._progress_seen.pop(job.key, None)
        job.state = state
        for name, value in fields.items():
            setattr(job, name, value)
        if job.ended_at is None:
            job.ended_at = time.time()
        self._done.append(job)
        self._emit(EventKind.ENDED, job)

    def _emit(
        self,
        kind: EventKind,
        job: JobRecord,
        detail: str = "",
        progress: JobProgress | None = None,
    ) -> None:
        event = JobEvent(kind, job, detail, progress)
        for listener in self._listeners:
            listener(event)

    def _result_path(self, job: JobRecord) -> Path:
        # id() is unique while the job is held here, and a job is held until it is handed back.
        return self._runtime_dir / f"{id(job):x}-{job.attempts}.result"


def _preempted(report: ChildReport | None, wait_status: int) -> str | None:
    """What preempted a job, in words, or None: it raised JobPreempted (having saved), or a
    preemption signal killed it (a task that does not train through ``fit``)."""
    if report is not None:
        return None if report.preempted is None else report.preempted
    if os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) in PREEMPTION_SIGNALS:
        name = signal.Signals(os.WTERMSIG(wait_status)).name
        return f"preempted by {name} (its process ended by it; it resumes from its last checkpoint)"
    return None


def _placement(slot: Slot) -> Placement:
    return Placement(slot.index, slot.env(), slot.cpus, slot.threads)


def _kill_group(pid: int) -> None:
    # A job is its own session and process group (pgid == pid); its DataLoader workers too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
