"""A pool of slots that runs each job in a fresh process forked from a warm server.

    submit(spec) ──► queue ──► free slot? ──► Start ──► fork server ──► job process
                                   ▲                                       │ exits
    wait_any() ◄── JobResult ◄── result file / exit status ◄── Exited ◄────┘
                                   └── slot freed, next queued job dispatched at once

Used synchronously (``run_all``: submit everything, results in input order) or asynchronously
(``submit`` then ``wait_any``), which is how the sweepers keep every slot busy. One thread owns a
pool; nothing here imports Hydra.
"""

from __future__ import annotations

import collections
import enum
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from furcate_hydra.execution.exits import describe_wait_status
from furcate_hydra.execution.forkserver import ChildReport, ForkServerClient
from furcate_hydra.execution.forkserver.protocol import Exited, Start, Started, StartFailed
from furcate_hydra.execution.slots import Slot, SlotPlan

__all__ = ["JobResult", "JobSpec", "JobState", "PoolOptions", "SlotPool"]

log = logging.getLogger(__name__)

STDOUT_NAME = "stdout.log"
STDERR_NAME = "stderr.log"


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"  # the job ran and returned a value
    FAILED = "failed"  # the job raised, called sys.exit, or its value could not be pickled
    CRASHED = "crashed"  # the process died without reporting (signal, os._exit)
    CANCELLED = "cancelled"  # stopped by the pool's owner before it finished

    @property
    def finished(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


@dataclass(frozen=True)
class JobSpec:
    """One job: an opaque payload for the warm context, and where its logs go."""

    key: str
    payload: bytes
    log_dir: Path
    label: str = ""


@dataclass
class JobResult:
    spec: JobSpec
    state: JobState = JobState.QUEUED
    value: Any = None
    error: str | None = None
    slot: Slot | None = None
    pid: int | None = None
    attempts: int = 0
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def stdout_path(self) -> Path:
        return self.spec.log_dir / STDOUT_NAME

    @property
    def stderr_path(self) -> Path:
        return self.spec.log_dir / STDERR_NAME


@dataclass(frozen=True)
class PoolOptions:
    # re-run a job whose process crashed (not one that raised) up to this many times
    max_retries: int = 0
    # modules the fork server imports once so that jobs start warm
    preload: tuple[str, ...] = ("torch", "pytorch_lightning")
    # copy each job's stdout/stderr onto the launcher's console as well as its log files
    echo_output: bool = True
    # time a stopped job gets between SIGTERM and SIGKILL
    stop_grace_s: float = 5.0


class SlotPool:
    """Runs jobs on the slots of a plan, one fresh process per job."""

    def __init__(self, plan: SlotPlan, context: bytes, options: PoolOptions | None = None) -> None:
        self.plan = plan
        self.options = options or PoolOptions()
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="furcate-"))
        self._server = ForkServerClient(list(self.options.preload), context)
        self._free: list[Slot] = list(plan.slots)
        self._busy_per_device: collections.Counter[str | None] = collections.Counter()
        self._queue: collections.deque[JobResult] = collections.deque()
        self._running: dict[str, JobResult] = {}
        self._cancelled: set[str] = set()
        self._done: list[JobResult] = []
        self._closed = False

    @property
    def server_start_s(self) -> float:
        return self._server.start_s

    def set_context(self, context: bytes) -> None:
        """Replace the warm context for jobs started from now on."""
        self._server.set_context(context)

    def submit(self, spec: JobSpec) -> None:
        if spec.key in self._running or any(job.spec.key == spec.key for job in self._queue):
            raise ValueError(f"job key {spec.key!r} is already queued or running")
        self._queue.append(JobResult(spec))
        self._dispatch()
        # Take in jobs that ended meanwhile, so a caller busy submitting (composing configs)
        # does not leave their slots idle until it next waits.
        self._drain_events()

    @property
    def pending(self) -> int:
        """Jobs submitted but not yet handed back by ``wait_any``."""
        return len(self._queue) + len(self._running) + len(self._done)

    @property
    def idle_slots(self) -> int:
        return len(self._free)

    def wait_any(self, timeout: float | None = None) -> list[JobResult]:
        """Block until at least one job finishes (or ``timeout`` passes); return what finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done and (self._running or self._queue):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            event = self._server.receive(timeout=remaining)
            if event is not None:
                self._on_event(event)
        done, self._done = self._done, []
        return done

    def _drain_events(self) -> None:
        while (event := self._server.receive(timeout=0)) is not None:
            self._on_event(event)

    def as_completed(self) -> Iterator[JobResult]:
        while self.pending:
            yield from self.wait_any()

    def run_all(self, specs: Sequence[JobSpec]) -> list[JobResult]:
        """Submit every job, wait for all of them, return results in input order."""
        for spec in specs:
            self.submit(spec)
        by_key = {result.spec.key: result for result in self.as_completed()}
        return [by_key[spec.key] for spec in specs]

    def cancel(self, keys: Iterable[str]) -> None:
        """Drop queued jobs and stop running ones; each still comes back as CANCELLED."""
        for key in keys:
            for job in list(self._queue):
                if job.spec.key == key:
                    self._queue.remove(job)
                    self._finish(job, JobState.CANCELLED, error="cancelled before it started")
            if key in self._running:
                self._cancelled.add(key)
                self._server.kill(key, signal.SIGTERM)

    def close(self) -> None:
        """Stop every job's process group and the fork server; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._running:
            log.warning("Stopping %d running job(s)", len(self._running))
        self._server.shutdown(self.options.stop_grace_s)
        shutil.rmtree(self._runtime_dir, ignore_errors=True)

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._queue and self._free:
            slot = min(self._free, key=lambda s: (self._busy_per_device[s.device], s.index))
            self._free.remove(slot)
            self._busy_per_device[slot.device] += 1
            job = self._queue.popleft()
            job.slot, job.state = slot, JobState.RUNNING
            job.attempts += 1
            job.spec.log_dir.mkdir(parents=True, exist_ok=True)
            self._running[job.spec.key] = job
            self._server.start(
                Start(
                    key=job.spec.key,
                    payload=job.spec.payload,
                    env=slot.env(),
                    cpus=slot.cpus,
                    threads=slot.threads,
                    stdout_path=str(job.stdout_path),
                    stderr_path=str(job.stderr_path),
                    result_path=str(self._result_path(job)),
                    echo=self.options.echo_output,
                )
            )

    def _on_event(self, event: object) -> None:
        if isinstance(event, Started):
            job = self._running[event.key]
            job.pid, job.started_at = event.pid, event.forked_at
        elif isinstance(event, StartFailed):
            self._release(self._running.pop(event.key), JobState.FAILED, error=event.error)
        elif isinstance(event, Exited):
            job = self._running.pop(event.key)
            job.ended_at = event.ended_at
            self._on_exit(job, event.wait_status)

    def _on_exit(self, job: JobResult, wait_status: int) -> None:
        report = self._read_report(job)
        if job.spec.key in self._cancelled:
            self._cancelled.discard(job.spec.key)
            self._release(job, JobState.CANCELLED, error="stopped by the launcher")
        elif report is not None and report.error is None:
            self._release(job, JobState.COMPLETED, value=report.value)
        elif report is not None:
            self._release(job, JobState.FAILED, error=f"{report.error}{self._see_logs(job)}")
        elif job.attempts <= self.options.max_retries:
            log.warning(
                "Job %s crashed (%s); retry %d of %d",
                job.spec.label or job.spec.key,
                describe_wait_status(wait_status),
                job.attempts,
                self.options.max_retries,
            )
            self._free_slot(job)
            job.state = JobState.QUEUED
            self._queue.appendleft(job)
            self._dispatch()
        else:
            error = f"{describe_wait_status(wait_status)}{self._see_logs(job)}"
            self._release(job, JobState.CRASHED, error=error)

    def _read_report(self, job: JobResult) -> ChildReport | None:
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

    def _release(self, job: JobResult, state: JobState, **fields: Any) -> None:
        self._free_slot(job)
        self._finish(job, state, **fields)
        self._dispatch()

    def _free_slot(self, job: JobResult) -> None:
        if job.slot is not None:
            self._busy_per_device[job.slot.device] -= 1
            self._free.append(job.slot)

    def _finish(self, job: JobResult, state: JobState, **fields: Any) -> None:
        job.state = state
        for name, value in fields.items():
            setattr(job, name, value)
        if job.ended_at is None:
            job.ended_at = time.time()
        self._done.append(job)

    def _result_path(self, job: JobResult) -> Path:
        # id() is unique while the job is held here, and a job is held until it is handed back.
        return self._runtime_dir / f"{id(job):x}-{job.attempts}.result"

    @staticmethod
    def _see_logs(job: JobResult) -> str:
        return f"\nSee the job's logs: {job.stdout_path} and {job.stderr_path}"
