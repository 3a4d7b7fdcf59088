"""Messages between the launcher and its warm fork server.

They travel pickled over one Unix socket (``multiprocessing.connection``). Job payloads and the
warm context stay opaque bytes here: the server never unpickles a payload, only the forked child
does, so one bad payload can only fail its own job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ChildReport",
    "Exited",
    "Imported",
    "Init",
    "InitFailed",
    "Kill",
    "Placement",
    "Preload",
    "Preloaded",
    "Ready",
    "Release",
    "SetContext",
    "Shutdown",
    "Start",
    "StartFailed",
    "Started",
    "Stopped",
    "Unused",
    "WarmContext",
]


class WarmContext(Protocol):
    """What the server holds between jobs.

    ``prepare`` runs once in the server (before any fork), so everything it imports or builds is
    inherited by every job for free. It must never initialise CUDA. ``before_fork`` runs in the
    server before each job is forked, with the job's own variables: what it warms there, every
    later job inherits. ``run`` runs in the forked child and returns the job's value, which
    must be picklable; it calls ``gate`` right before the job's own code (which, for a job
    forked ahead of its slot, waits for the slot and puts the slot's environment in place).
    """

    def prepare(self) -> None: ...

    def after_imports(self) -> None:
        """The server imported more (what its jobs were seen to import): warm what that
        allows, as ``prepare`` would have."""

    def before_fork(self, env: Mapping[str, str]) -> None: ...

    def run(self, payload: bytes, gate: Callable[[], None]) -> Any: ...


@dataclass(frozen=True)
class Placement:
    """Where a job runs: its slot's index, variables, pinned cores and thread count."""

    slot: int
    env: dict[str, str]
    cpus: tuple[int, ...] | None
    threads: int | None


# launcher -> server


@dataclass(frozen=True)
class Init:
    sys_path: list[str]
    cwd: str
    preload: list[str]
    context: bytes


@dataclass(frozen=True)
class SetContext:
    context: bytes


@dataclass(frozen=True)
class Start:
    """Fork a job. Without a placement the job is forked ahead: it does its set-up, then waits
    until a running job exits (and takes that job's slot) or a ``Release`` places it."""

    key: str
    payload: bytes
    env: dict[str, str]  # the job's own variables; its slot's come with the placement
    placement: Placement | None
    stdout_path: str
    stderr_path: str
    result_path: str
    echo: bool
    # what the job's process holds in memory only (``furcate_hydra.job_secrets``)
    secrets: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Release:
    """Place the oldest job forked ahead on this free slot (``Unused`` if none is left)."""

    placement: Placement


@dataclass(frozen=True)
class Kill:
    key: str
    signum: int


@dataclass(frozen=True)
class Shutdown:
    grace_s: float


@dataclass(frozen=True)
class Preload:
    """Packages the jobs imported themselves: import them once in the server (tried in a
    probe first, unless well known), so that later jobs start with them."""

    modules: list[str]
    # what the trial of one module not known to import cleanly may take
    probe_limit_s: float = 120.0


# server -> launcher


@dataclass(frozen=True)
class Ready:
    pid: int
    preload_s: float
    preloaded: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class InitFailed:
    error: str


@dataclass(frozen=True)
class Started:
    """The job's process runs it on ``slot`` since ``started_at``; ``after``: the job whose
    exit freed that slot, when it was forked ahead."""

    key: str
    pid: int
    started_at: float
    slot: int
    after: str | None = None


@dataclass(frozen=True)
class Unused:
    """A ``Release`` found no job forked ahead: the slot is still free."""

    slot: int


@dataclass(frozen=True)
class StartFailed:
    key: str
    error: str


@dataclass(frozen=True)
class Exited:
    key: str
    wait_status: int
    ended_at: float


@dataclass(frozen=True)
class Imported:
    """A running job has just imported these heavy packages, which the server lacks."""

    key: str
    modules: list[str]


@dataclass(frozen=True)
class Preloaded:
    """A ``Preload`` is done: what the server imported (in ``seconds``) and what it would not,
    with why."""

    imported: list[str]
    refused: dict[str, str]
    seconds: float


@dataclass(frozen=True)
class Stopped:
    """The server has stopped every job and is about to exit."""


# child -> launcher, through the result file


@dataclass(frozen=True)
class ChildReport:
    """What a job's process hands back before it exits.

    ``error`` holds a formatted traceback when ``run`` raised or its value could not be pickled;
    ``exit_code`` is set when the job called ``sys.exit``; ``preempted`` says what stopped a
    job that raised ``JobPreempted`` (it saved a checkpoint to resume from); ``failure`` is
    the task's traceback where ``run`` returned a value that stands for its failure (the Hydra
    layer's outcome of a task that raised says so in its own ``failure``);
    ``gpu_peak_bytes`` is the most GPU memory the job's torch says it held (see
    ``gpu_report``), None where it used no GPU; ``imported``: the installed packages the job
    imported itself (``job_imports``), which its server could have had.
    """

    value: Any = None
    error: str | None = None
    exit_code: int | None = None
    preempted: str | None = None
    failure: str | None = None
    gpu_peak_bytes: int | None = None
    imported: tuple[str, ...] = ()
