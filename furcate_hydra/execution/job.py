"""One object per job, shared by the launcher, its executor and its run ledger.

A job is not a key into several dicts: the launcher makes one ``Job`` when it composes it
(key, num, overrides, label, paths, env, config, task_config), the ledger fills in the store's
side (fingerprint, run_id, resumed, skipped; paths and env of a resumed run), the executor the
process's side (payload aside: slot, pid, node, attempts, preemptions, times, state, value,
error, progress). The job is handed back by ``Executor.wait_any`` and dropped by its owner once
its outcome is in its run.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from furcate_hydra.execution.slots import Slot
from furcate_hydra.layout import JobPaths
from furcate_hydra.progress import JobProgress

__all__ = ["Job", "JobState"]


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"  # the job ran and returned a value
    FAILED = "failed"  # the job raised, called sys.exit, or its value could not be pickled
    CRASHED = "crashed"  # the process died without reporting (signal, os._exit)
    CANCELLED = "cancelled"  # stopped by the executor's owner before it finished
    LOST = "lost"  # the executor itself broke (its fork server died) while the job was held
    # stopped from outside (SIGTERM, SIGUSR1) once more than the executor queues again
    PREEMPTED = "preempted"

    @property
    def finished(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


@dataclass(eq=False)
class Job:
    """A job from submission to outcome.

    Attributes:
        key: Unique among the jobs an executor holds (the launcher uses the job number).
        num: Hydra's ``hydra.job.num``.
        overrides: The job's overrides, as the sweeper gave them.
        label: The task's overrides as one line, for logs.
        paths: Every file of the job.
        payload: What the job's process runs, opaque to the executor.
        env: Variables the launcher sets for the job (its run, its dirs, its trial).
        secrets: What the job's process is handed in memory, never in its environment (its
            fused group's key: ``furcate_hydra.job_secrets``).
        config: The job's composed config, opaque outside the Hydra layer.
        task_config: The task's part of ``config`` as plain values (what is fingerprinted).
        fingerprint: The store's key for the job's config (None before it is looked up).
        run_id: The job's MLflow run, once the run ledger opened it.
        resumed: Whether that run is an interrupted one, resumed.
        skipped: Whether the job did not run because its config was recorded already.
        state: Where the job is; ``finished`` once the executor handed it back.
        slot: The slot it ran on (last attempt).
        pid: Its process id (last attempt).
        node: The machine its process runs on (last attempt), where that is not this one
            (a Ray node's address); None on this machine.
        attempts: How many times a process was started for it.
        preemptions: How many of those processes were preempted (signalled from outside the
            executor; each saved where it was and the next attempt resumed from there).
        memory_retries: How many of them ran out of GPU memory beside other jobs and were
            queued again (``jobs_per_gpu=auto``), not counted as retries.
        value: What the job returned (COMPLETED).
        error: Why it did not complete, in words (FAILED, CRASHED, CANCELLED, LOST,
            PREEMPTED).
        progress: The latest progress the running job reported, if it reports any.
    """

    key: str
    num: int
    overrides: tuple[str, ...]
    label: str
    paths: JobPaths
    payload: bytes = b""
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, bytes] = field(default_factory=dict)
    config: Any = None
    task_config: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    run_id: str | None = None
    resumed: bool = False
    skipped: bool = False
    state: JobState = JobState.QUEUED
    slot: Slot | None = None
    pid: int | None = None
    node: str | None = None
    attempts: int = 0
    preemptions: int = 0
    memory_retries: int = 0
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    value: Any = None
    error: str | None = None
    progress: JobProgress | None = None

    @property
    def name(self) -> str:
        """How logs and messages name the job: ``#3 (lr=0.1)``."""
        return f"#{self.num} ({self.label or 'no overrides'})"

    @property
    def queued_s(self) -> float | None:
        return None if self.started_at is None else self.started_at - self.submitted_at
