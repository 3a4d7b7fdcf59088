"""What the launcher needs from whatever runs its jobs: the backend seam.

    launcher ── submit(Job) ──► executor ──► a fresh process per job, on a free slot
             ◄─ wait_any() ── jobs whose state is final (COMPLETED, FAILED, CRASHED, ...)
             ◄─ listeners ── JobEvent: STARTED, PROGRESS, RETRYING, PREEMPTED, ENDED, as they
                             happen

The contract every implementation keeps:

- One thread owns an executor; none of its methods is called concurrently.
- Every submitted job comes back from ``wait_any`` exactly once, with a final state, whatever
  happened to its process, and also after ``cancel`` (as CANCELLED) or when the executor broke
  (as LOST). A job's death never raises here.
- When the executor's own machinery dies, it is broken: every job it holds comes back LOST with
  the reason, and ``submit`` raises :class:`~furcate_hydra.errors.ExecutorBrokenError`.
- ``close`` stops every job still running (and its process group) and is idempotent.
- A job stopped by a signal from outside the executor (SIGTERM, SIGUSR1: a scheduler preempting
  it) is queued again, up to a limit, and resumes from the checkpoint it saved; one the
  executor stopped itself (``cancel``, ``close``) never is.
- Nothing starts before ``start``, ``wait_ready`` or the first ``submit``: an executor that
  never gets a job costs nothing.

``JobPool`` (``furcate_hydra.execution.job_pool``) keeps it for every backend, over a backend's
``Transport``: the local fork server (``local_pool``), Ray slot actors (``ray_backend.pool``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from furcate_hydra.execution.job import Job
from furcate_hydra.progress import JobProgress

__all__ = ["EventKind", "Executor", "JobEvent", "JobListener"]


class EventKind(enum.Enum):
    STARTED = "started"  # a process runs the job (again, on a retry)
    PROGRESS = "progress"  # the job reported where its training is (``job.progress``)
    RETRYING = "retrying"  # its process crashed; it is queued for another attempt
    PREEMPTED = "preempted"  # stopped from outside; queued again, to resume where it stopped
    ENDED = "ended"  # its state is final; it comes out of the next wait_any


@dataclass(frozen=True)
class JobEvent:
    """What happened to a job. ``job`` is the live job (it changes later); what the event
    says of this moment is in its own fields."""

    kind: EventKind
    job: Job
    detail: str = ""  # for RETRYING and PREEMPTED: why the last attempt ended
    progress: JobProgress | None = None  # for PROGRESS: what the job reported
    at: float = field(default_factory=time.time)


JobListener = Callable[[JobEvent], None]


@runtime_checkable
class Executor(Protocol):
    """Runs jobs, each in a fresh process, on a fixed number of slots (see the module doc)."""

    @property
    def slot_count(self) -> int:
        """How many jobs run at once."""
        ...

    @property
    def idle_slots(self) -> int:
        """Slots with no job right now."""
        ...

    @property
    def pending(self) -> int:
        """Jobs submitted but not yet handed back by ``wait_any``."""
        ...

    def describe(self) -> str:
        """Where jobs run, in one log line."""
        ...

    def start(self) -> None:
        """Start the machinery that runs jobs (it may go on loading after this returns)."""
        ...

    def wait_ready(self) -> None:
        """Start the machinery if needed and wait until it can run jobs.

        Raises:
            ForkServerError: it could not start (the error says why).
        """
        ...

    def set_context(self, context: bytes) -> None:
        """Replace what every job's process is started with (the warm task), from now on."""
        ...

    def submit(self, job: Job) -> None:
        """Queue a job; it starts as soon as a slot is free."""
        ...

    def wait_any(self, timeout: float | None = None) -> list[Job]:
        """Block until at least one job ends (or ``timeout`` passes); return those that ended."""
        ...

    def cancel(self, keys: Iterable[str]) -> None:
        """Drop queued jobs and stop running ones; each still comes back, CANCELLED."""
        ...

    def preload(self, modules: Sequence[str]) -> None:
        """Have the jobs to come start with ``modules`` imported, where the executor can."""

    @property
    def learned_imports(self) -> tuple[str, ...]:
        """Modules its fork server imported because jobs imported them themselves."""

    def add_listener(self, listener: JobListener) -> None:
        """Call ``listener`` with each event, on the owner's thread, as the executor sees it."""
        ...

    def close(self) -> None:
        """Stop every job still running and release the slots; idempotent."""
        ...
