"""What a backend does for the job pool: carry jobs to slots and tell what became of them.

    JobPool (the lifecycle: queue, cancellation, retries, preemption, broken state, events)
        │ has_room(), place(job) ──► a slot (or ahead of one)   stop(job) ──► SIGTERM it
        │ poll(timeout) ◄── Started / Ended / Freed / Broken            abandon(), close()
        ▼
    Transport: the fork server of this machine (``local_pool``), Ray slot actors
    (``ray_backend.pool``), or a fake one in the tests

A transport knows slots, processes and its machinery; what a job's end means (a retry, a
preemption queued again, a cancellation, its final state) is the pool's to decide.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import cloudpickle

from furcate_hydra.execution.forkserver.protocol import ChildReport
from furcate_hydra.execution.job import Job
from furcate_hydra.execution.slots import Slot

__all__ = [
    "Broken",
    "Ended",
    "Freed",
    "Placed",
    "Report",
    "Started",
    "Transport",
    "TransportBroken",
    "load_report",
]


class TransportBroken(Exception):
    """The transport's machinery is gone (its fork server died, no slot is left): no job it
    holds will be reported any more."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Placed:
    """Where a job runs: its slot, and the node, where that is not this machine."""

    slot: Slot
    node: str | None = None


@dataclass(frozen=True)
class Started:
    """The job's process runs since ``started_at``; ``placed``: the slot it took now, when it
    was placed ahead of one."""

    key: str
    pid: int
    started_at: float
    placed: Placed | None = None


@dataclass(frozen=True)
class Ended:
    """A placed job is no longer held by the transport, and what is known of why.

    Attributes:
        report: What the job's process handed back (its result file), None if nothing.
        wait_status: How its process ended (``os.waitpid``), None if unknown.
        ended_at: When it ended, None if unknown (the pool takes the time it hears of it).
        start_error: Its process could not be started, in words.
        died: The machinery under the job died while it ran (a Ray slot actor), in words.
        where: Where it ran, for a crash's reason ("node 10.0.0.5 (...)"); None: here.
    """

    key: str
    report: ChildReport | None = None
    wait_status: int | None = None
    ended_at: float | None = None
    start_error: str | None = None
    died: str | None = None
    where: str | None = None


@dataclass(frozen=True)
class Freed:
    """A slot became free with no job ending (a new actor started, a slot offered ahead found
    no job): the pool places queued jobs. A job's ``Started`` frees nothing."""


@dataclass(frozen=True)
class Broken:
    """The transport broke after the reports before this one (``TransportBroken``'s reason)."""

    reason: str


Report: TypeAlias = Started | Ended | Freed | Broken


class Transport(abc.ABC):
    """Places jobs on slots and reports what happened to them; ``JobPool`` does the rest.

    The contract:

    - Threads: the pool's owner thread calls every method; none is called concurrently. A
      transport may run threads of its own, but tells the pool only through ``poll``.
    - Ownership: the pool owns every ``Job`` and writes it (state, slot, pid, times,
      attempts, outcome); a transport reads a placed job's inputs (key, payload, env, paths,
      attempts, pid) and never writes one. The transport owns its slots, its processes and
      their machinery.
    - Every job ``place`` took comes back from ``poll`` as exactly one ``Ended`` (its slot is
      free again, or given to a job placed ahead, by then), after at most one ``Started`` per
      placement; until ``abandon``, which forgets them all.
    - ``place``, ``stop``, ``set_context`` and ``poll`` raise ``TransportBroken`` when the
      machinery is gone; ``poll`` reports what it learnt before that, then ``Broken``. The
      pool then calls ``abandon`` and, later, ``close``, and nothing else.
    """

    #: how logs and errors name this pool: "the {name} is broken"
    name: str = "slot pool"

    @property
    @abc.abstractmethod
    def slot_count(self) -> int:
        """How many jobs run at once."""

    @property
    @abc.abstractmethod
    def idle_slots(self) -> int:
        """Slots with no job right now."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where jobs run, in one log line."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the machinery, if it is not started yet (it may go on loading)."""

    @abc.abstractmethod
    def wait_ready(self) -> None:
        """Start the machinery if needed and wait until it can run jobs.

        Raises:
            ForkServerError: it could not start (the error says why).
        """

    @abc.abstractmethod
    def set_context(self, context: bytes) -> None:
        """What every job's process starts with, from now on."""

    @abc.abstractmethod
    def has_room(self) -> bool:
        """Whether ``place`` takes a job now (on a free slot, or ahead of one)."""

    @abc.abstractmethod
    def place(self, job: Job) -> Placed | None:
        """Start ``job`` (``job.attempts`` counts this attempt already): on a free slot,
        returned, or ahead of one (None), its slot told later by ``Started.placed``."""

    @abc.abstractmethod
    def stop(self, job: Job) -> None:
        """Ask a placed job's process to stop (SIGTERM); its ``Ended`` follows."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> list[Report]:
        """What happened since the last poll, waiting up to ``timeout`` s for something."""

    @abc.abstractmethod
    def abandon(self) -> None:
        """The pool gave up every job (it is broken): kill what still runs and forget every
        job and every slot. Never raises."""

    def preload(self, modules: Sequence[str]) -> None:
        """Have the machinery import ``modules`` for the jobs to come (what this app's jobs
        imported in an earlier sweep). A transport that cannot leaves it."""
        del modules  # one without a fork server of its own has nowhere to import them

    @property
    def learned_imports(self) -> tuple[str, ...]:
        """What the machinery imported because the jobs were seen to, in its order."""
        return ()

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every job still running and the machinery; idempotent, never raises for a
        machinery already gone."""


def load_report(data: bytes) -> ChildReport | None:
    """A job's pickled ``ChildReport``; one that cannot be unpickled is a failure that says so."""
    try:
        report = cloudpickle.loads(data)
    except Exception as exc:
        return ChildReport(error=f"the job's result could not be unpickled: {exc!r}")
    return report if isinstance(report, ChildReport) else None
