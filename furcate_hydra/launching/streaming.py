"""The contract between furcate's sweepers and a launcher that streams jobs onto its slots.

Hydra's sweepers hand a launcher a batch and wait for all of it. A streaming launcher also takes
jobs one by one and hands back each result as it comes, so a sweeper can give a slot its next job
the moment the last one ends. ``as_streaming`` is the one check the sweepers make; any launcher
that is not streaming gets Hydra's batches.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

__all__ = ["LOOKUP_CHUNK", "JobRequest", "JobRun", "StreamingLauncher", "as_streaming"]

# Most jobs worth one ``submit_batch`` beyond the free slots: each batch is one store query, and
# a rerun that finds whole batches recorded (skipped) grows its batches up to this.
LOOKUP_CHUNK = 64


@dataclass(frozen=True)
class JobRequest:
    """One job a sweeper asks for.

    Attributes:
        overrides: The task's overrides, as for ``Launcher.launch``.
        num: Its ``hydra.job.num``.
        env: Variables for the job's process beyond the launcher's own (the Optuna sweeper
            passes the job its trial this way).
    """

    overrides: Sequence[str]
    num: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobRun:
    """The MLflow run of a submitted job, and whether the job was skipped because that run
    had FINISHED its config already (its return value read from the record), or waits while
    another launcher runs its config in that run (it takes no slot here)."""

    run_id: str | None
    skipped: bool = False
    elsewhere: bool = False


class StreamingLauncher(Protocol):
    """What the furcate launcher offers beyond Hydra's ``launch``.

    Checked structurally (``as_streaming``): Hydra may load a plugin module twice, so an
    ``isinstance`` against the launcher's class could fail for the very same launcher.
    """

    @property
    def slot_count(self) -> int:
        """How many jobs run at once."""
        ...

    @property
    def jobs_ahead(self) -> int:
        """How many jobs beyond the free slots are worth submitting: the launcher has them
        ready (forked, set up) to start the moment a slot frees; 0: none."""
        ...

    @property
    def tracking_uri(self) -> str | None:
        """Where jobs are recorded; None when MLflow recording is off."""
        ...

    @property
    def sweep_run_id(self) -> str | None:
        """The sweep's MLflow run, parent of the jobs' runs (once a job was submitted)."""
        ...

    def streaming(self) -> AbstractContextManager[None]:
        """Wrap the submits and waits of one sweep: logging and the sweep dir set up first,
        every job stopped on Ctrl-C or SIGTERM, the sweep's run data written at the end."""
        ...

    def warm_up(self) -> None:
        """Start the slots' pool and open the store now, not at the first job that runs (inside
        ``streaming``): a sweeper does so before it starts a thread of its own, so that the
        launcher's warm fork server is still a fork of this process."""
        ...

    def submit_batch(self, jobs: Sequence[JobRequest]) -> list[str]:
        """Queue jobs with one store lookup for all of them; returns their keys."""
        ...

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        """Wait until at least one submitted job ends; ``(key, JobReturn)`` pairs."""
        ...

    def job_run(self, key: str) -> JobRun:
        """The MLflow run of a job submitted under ``key``."""
        ...

    def sweep_status(
        self, to_come: int | None = None, best: str | None = None, pruned: int | None = None
    ) -> None:
        """What only the sweeper knows, for the progress view: how many jobs it will still
        submit, its best result so far (as it words it), how many trials it pruned."""
        ...

    def job_pruned(self, key: str, epoch: int | None) -> None:
        """The job submitted under ``key`` (handed back) was a trial the sweeper pruned at
        ``epoch``: the sweep's summary names it so."""
        ...

    def config_files_changed(self) -> None:
        """Compose jobs submitted from now on from the config files as they are now."""
        ...


# Every member of the protocol; a launcher streams only if its class has all of them.
_MEMBERS = tuple(name for name in vars(StreamingLauncher) if not name.startswith("_"))


def as_streaming(launcher: Launcher) -> StreamingLauncher | None:
    """The launcher as a streaming one, or None when it only takes batches.

    Looked up on the class, without evaluating anything: on Python 3.11 a runtime-checkable
    Protocol would read ``slot_count``, which starts the launcher's pool.
    """
    kind = type(launcher)
    if all(inspect.getattr_static(kind, name, None) is not None for name in _MEMBERS):
        return launcher  # type: ignore[return-value]
    return None
