"""The Ray executor: the ``Executor`` contract kept with one warm slot actor per slot.

    submit(job) ──► queue ──► free slot ──► actor.run(Start) ──► fork server ──► job process
                  STARTED (pid, node) ◄── actor.forked(key) ◄───────────────────┘ forked
    wait_any() ◄── JobRecord ◄── SlotResult (result file, exit status) ◄──────────┘ exits
                   ◄── the actor (or its node) died ──► CRASHED naming the node, or a retry;
                       the slot gets a new actor

The launcher's side of a job is the same as with ``LocalPool``: its dirs, logs and progress
file are paths the job writes (on one machine, or on a filesystem every node mounts), its run
is created by the launcher, its value comes back pickled. Nothing here imports Hydra.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import cloudpickle

from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.executor import EventKind, JobEvent, JobListener
from furcate_hydra.execution.exits import describe_wait_status
from furcate_hydra.execution.forkserver import ChildReport
from furcate_hydra.execution.forkserver.protocol import Placement, Start
from furcate_hydra.execution.job import JobRecord, JobState
from furcate_hydra.execution.local_pool import PoolOptions
from furcate_hydra.preemption import PREEMPTION_SIGNALS
from furcate_hydra.progress import JobProgress, read_progress
from furcate_hydra.ray_backend.actors import SlotActors
from furcate_hydra.ray_backend.cluster import RaySlotPlan
from furcate_hydra.ray_backend.slot_actor import NodeInfo, SlotResult

__all__ = ["RayPool"]

log = logging.getLogger(__name__)

# Longest a wait goes without looking for a Ctrl-C or polling progress files.
_WAIT_SLICE_S = 1.0


class RayPool:
    """Runs jobs on Ray slot actors, one fresh forked process per job (see the module doc)."""

    def __init__(
        self,
        plan: RaySlotPlan,
        context: bytes,
        options: PoolOptions,
        ray: Any,
        start_timeout_s: float,
        owns_ray: bool,
    ) -> None:
        """``ray``: the connected ``ray`` module; ``owns_ray``: disconnect it on ``close``."""
        self.plan = plan
        self.options = options
        self._ray = ray
        self._owns_ray = owns_ray
        self._actors = SlotActors(ray, plan, options.preload, context, start_timeout_s)
        self._free: list[int] = []
        self._queue: collections.deque[JobRecord] = collections.deque()
        self._running: dict[str, JobRecord] = {}
        self._refs: dict[Any, str] = {}  # ObjectRef of a slot's run() -> job key
        # ObjectRef of a slot's forked() -> (job key, attempt): STARTED once it resolves
        self._forks: dict[Any, tuple[str, int]] = {}
        self._started: set[str] = set()  # running jobs whose STARTED was emitted
        self._cancelled: set[str] = set()
        self._done: list[JobRecord] = []
        self._listeners: list[JobListener] = []
        self._progress_seen: dict[str, int] = {}
        self._progress_polled = 0.0
        self._broken: str | None = None
        self._closed = False
        began = time.perf_counter()
        self._free = self._actors.start_all()
        self.start_s = time.perf_counter() - began

    # -- the Executor contract ---------------------------------------------------------

    @property
    def slot_count(self) -> int:
        return len(self.plan.slots)

    @property
    def idle_slots(self) -> int:
        return len(self._free)

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._running) + len(self._done)

    @property
    def nodes(self) -> dict[int, NodeInfo]:
        """Where each slot's actor runs now."""
        return dict(self._actors.nodes)

    def describe(self) -> str:
        ips = sorted({info.ip for info in self._actors.nodes.values()})
        return f"{self.plan.describe()}; actors on {', '.join(ips) or 'no node yet'}"

    def start(self) -> None:
        """Nothing to do: unlike the local pool, the slot actors start with the pool (its plan
        joined the cluster already, and Ray starts actors in seconds, not per job)."""

    def wait_ready(self) -> None:
        """Nothing to wait for: the pool waited for its actors when it was made."""

    def add_listener(self, listener: JobListener) -> None:
        self._listeners.append(listener)

    def set_context(self, context: bytes) -> None:
        if self._broken is None:
            self._actors.set_context(context)

    def submit(self, job: JobRecord) -> None:
        """Queue a job. Raises ExecutorBrokenError once the pool is broken."""
        if self._broken is not None:
            raise ExecutorBrokenError(
                f"Job {job.name} cannot start: the Ray slot pool is broken ({self._broken}). "
                "Every job it held was recorded as failed; start the sweep again to run what "
                "is left (finished configs are skipped)."
            )
        if job.key in self._running or any(queued.key == job.key for queued in self._queue):
            raise ValueError(f"job key {job.key!r} is already queued or running")
        job.state = JobState.QUEUED
        self._queue.append(job)
        self._dispatch()

    def wait_any(self, timeout: float | None = None) -> list[JobRecord]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done and (self._refs or (self._queue and self._actors.starting)):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            interrupts.check()
            wait = _WAIT_SLICE_S if remaining is None else min(remaining, _WAIT_SLICE_S)
            refs = [*self._forks, *self._refs, *self._actors.starting]
            ready, rest = self._ray.wait(refs, num_returns=1, timeout=wait)
            if ready and rest:  # every other job that ended meanwhile, in the same call
                ready += self._ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            # a job's start before its end, when both came in this call
            for ref in sorted(ready, key=lambda r: r not in self._forks):
                if ref in self._forks:
                    self._on_forked(ref)
                elif ref in self._actors.starting:
                    self._on_actor_started(ref)
                else:
                    self._on_result(ref)
            for index in self._actors.overdue():
                self._slot_lost(index)
            self._poll_progress()
        done, self._done = self._done, []
        return done

    def cancel(self, keys: Iterable[str]) -> None:
        for key in keys:
            for job in list(self._queue):
                if job.key == key:
                    self._queue.remove(job)
                    self._finish(job, JobState.CANCELLED, error="cancelled before it started")
            running = self._running.get(key)
            if running is not None and running.slot is not None:
                self._cancelled.add(key)
                self._actors[running.slot.index].kill.remote(key, signal.SIGTERM)

    def close(self) -> None:
        """Stop every job and slot actor; disconnect from Ray if the pool connected."""
        if self._closed:
            return
        self._closed = True
        if self._running:
            log.warning("Stopping %d running job(s) on Ray", len(self._running))
        if not self._ray.is_initialized():
            # Ray's own atexit hook ran first and disconnected: the actors (owned by this
            # driver) died with the connection, and any Ray call now would start a new
            # local instance.
            return
        self._actors.stop_all(self.options.stop_grace_s)
        if self._owns_ray:
            with contextlib.suppress(Exception):
                self._ray.shutdown()

    # -- slots -------------------------------------------------------------------------

    def _on_actor_started(self, ref: Any) -> None:
        index, runs = self._actors.on_started(ref)
        if runs:
            self._free.append(index)
            self._dispatch()
        else:
            self._slot_lost(index)

    def _slot_lost(self, index: int) -> None:
        """A slot is gone for good; with none left, the pool is broken."""
        if not (self._free or self._running or self._actors.starting):
            self._break(
                f"no Ray slot is left: the last one (slot {index}) could not get a new actor; "
                "see `ray status` for the nodes and resources left"
            )

    # -- jobs ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._queue and self._free and self._broken is None:
            index = self._free.pop(0)
            job = self._queue.popleft()
            job.slot, job.state = self.plan.slots[index], JobState.RUNNING
            job.attempts += 1
            # set when its process is forked (forked() or, at the latest, its result): a job
            # that ends without one never started, as LocalPool reads it
            job.ended_at, job.pid, job.started_at = None, None, None
            job.paths.output_dir.mkdir(parents=True, exist_ok=True)
            slot_env = {"FURCATE_SLOT": str(index)}  # Ray sets CUDA_VISIBLE_DEVICES itself
            if job.slot.threads is not None:
                for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                    slot_env[name] = str(job.slot.threads)
            start = Start(
                key=job.key,
                payload=job.payload,
                env=job.env,
                # Ray gives CPU counts, not cores: threads follow, nothing pinned
                placement=Placement(index, slot_env, None, job.slot.threads),
                stdout_path=str(job.paths.stdout),
                stderr_path=str(job.paths.stderr),
                result_path="",  # the actor's own, on its node
                echo=self.options.echo_output,
            )
            self._running[job.key] = job
            actor = self._actors[index]
            self._refs[actor.run.remote(start)] = job.key
            self._forks[actor.forked.remote(job.key)] = (job.key, job.attempts)
            node = self._actors.nodes.get(index)
            job.node = node.ip if node is not None else None

    def _on_forked(self, ref: Any) -> None:
        """The job's process exists on its node: STARTED, with its pid (as ``LocalPool``)."""
        key, attempt = self._forks.pop(ref)
        job = self._running.get(key)
        if job is None or job.attempts != attempt:
            return  # it ended (its result came first) or runs again
        try:
            fork: tuple[int, float] | None = self._ray.get(ref)
        except Exception:  # its actor died: the job's result says so
            return
        if fork is not None:
            job.pid, job.started_at = fork
            self._mark_started(job)

    def _mark_started(self, job: JobRecord) -> None:
        if job.key not in self._started:
            self._started.add(job.key)
            self._emit(EventKind.STARTED, job)

    def _on_result(self, ref: Any) -> None:
        job = self._running.pop(self._refs.pop(ref))
        assert job.slot is not None  # set at dispatch
        index = job.slot.index
        try:
            result: SlotResult = self._ray.get(ref)
        except Exception as exc:  # the actor or its node died, or its fork server did
            self._on_slot_death(job, index, exc)
            return
        job.pid = result.pid or job.pid
        job.started_at = result.started_at or job.started_at
        job.ended_at = result.ended_at
        if result.pid is not None:  # ended before its forked() came back: started first
            self._mark_started(job)
        self._started.discard(job.key)
        self._free.append(index)
        see_logs = f"\n{job.paths.see_logs()}"
        if job.key in self._cancelled:
            self._cancelled.discard(job.key)
            self._release(job, JobState.CANCELLED, error="stopped by the launcher")
        elif result.start_error is not None:
            self._release(job, JobState.FAILED, error=result.start_error)
        elif (why := _preempted(report := _report(result.report), result.wait_status)) is not None:
            self._on_preempted(job, why)
        elif report is not None and report.error is None:
            self._release(job, JobState.COMPLETED, value=report.value)
        elif report is not None:
            self._release(job, JobState.FAILED, error=f"{report.error}{see_logs}")
        else:
            why = "the job's process ended without a result"
            if result.wait_status is not None:
                why = describe_wait_status(result.wait_status)
            node = self._actors.nodes.get(index, "an unknown node")
            self._crashed(job, f"{why} (on {node})")

    def _on_slot_death(self, job: JobRecord, index: int, exc: Exception) -> None:
        self._started.discard(job.key)
        node = self._actors.nodes.get(index)
        where = str(node) if node is not None else "an unknown node"
        why = (
            f"the Ray worker of slot {index} on {where} died while running the job "
            f"({_first_line(exc)}); the node may be gone or out of memory (see `ray status` "
            "and the Ray logs of that node)"
        )
        log.warning("furcate: %s", why)
        self._actors.replace(index)
        if job.key in self._cancelled:
            self._cancelled.discard(job.key)
            self._release(job, JobState.CANCELLED, error="stopped by the launcher")
        else:
            self._crashed(job, why)

    def _queue_again(self, job: JobRecord, kind: EventKind, why: str) -> None:
        """A retried or preempted job goes back first in the queue (it ran before any queued
        job), told to the listeners as ``kind``."""
        job.state = JobState.QUEUED
        self._queue.appendleft(job)
        self._emit(kind, job, why)
        self._dispatch()

    def _on_preempted(self, job: JobRecord, why: str) -> None:
        """As ``LocalPool``: queue a preempted job again, first, up to ``max_preemptions``; it
        resumes from the checkpoint it saved, in its run."""
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

    def _crashed(self, job: JobRecord, why: str) -> None:
        """Retry the job if it has retries left, else it ends CRASHED with ``why``."""
        if self._broken is None and job.attempts - job.preemptions <= self.options.max_retries:
            log.warning(
                "Job %s crashed (%s); retry %d of %d",
                job.label or job.key,
                why,
                job.attempts,
                self.options.max_retries,
            )
            self._queue_again(job, EventKind.RETRYING, why)
        else:
            self._release(job, JobState.CRASHED, error=f"{why}\n{job.paths.see_logs()}")

    def _break(self, reason: str) -> None:
        """No slot can run jobs any more: everything held is LOST; submits raise."""
        if self._broken is not None:
            return
        self._broken = reason
        log.error("furcate: the Ray slot pool is broken: %s", reason)
        for key, job in list(self._running.items()):
            if job.slot is not None:
                with contextlib.suppress(Exception):
                    self._actors[job.slot.index].kill.remote(key, signal.SIGKILL)
        for job in [*self._running.values(), *self._queue]:
            self._finish(job, JobState.LOST, error=f"{reason}\n{job.paths.see_logs()}")
        self._running.clear()
        self._refs.clear()
        self._forks.clear()
        self._started.clear()
        self._actors.starting.clear()
        self._queue.clear()
        self._free = []

    def _release(self, job: JobRecord, state: JobState, **fields: Any) -> None:
        self._finish(job, state, **fields)
        self._dispatch()

    def _finish(self, job: JobRecord, state: JobState, **fields: Any) -> None:
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
        if not self._listeners or now - self._progress_polled < _WAIT_SLICE_S:
            return
        self._progress_polled = now
        for job in list(self._running.values()):
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
        job: JobRecord,
        detail: str = "",
        progress: JobProgress | None = None,
    ) -> None:
        event = JobEvent(kind, job, detail, progress)
        for listener in self._listeners:
            listener(event)


def _preempted(report: ChildReport | None, wait_status: int | None) -> str | None:
    """What preempted a job, in words, or None: it raised JobPreempted (having saved), or a
    preemption signal sent to it on its node killed it (as ``LocalPool`` reads it)."""
    if report is not None:
        return report.preempted
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum in PREEMPTION_SIGNALS:
            name = signal.Signals(signum).name
            return f"preempted by {name} (its process ended by it; it resumes from its checkpoint)"
    return None


def _report(data: bytes | None) -> ChildReport | None:
    if data is None:
        return None
    try:
        report = cloudpickle.loads(data)
    except Exception as exc:
        return ChildReport(error=f"the job's result could not be unpickled: {exc!r}")
    return report if isinstance(report, ChildReport) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
