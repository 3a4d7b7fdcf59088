"""What a sweep is doing, counted from the executor's events and what the launcher and the
sweeper add: the state behind the live view and the plain status lines.

Events arrive on the launcher's thread; a live view redraws from its own thread. Everything is
read through ``snapshot()``, under a lock, so a redraw never sees half an update.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from furcate_hydra.execution.executor import EventKind, JobEvent
from furcate_hydra.execution.job import Job, JobState

__all__ = ["RunningJob", "SweepSnapshot", "SweepTally"]


@dataclass(frozen=True)
class RunningJob:
    """One line of the view: a job a slot runs now (``epoch`` and ``metrics`` once it reports
    through ``furcate_hydra.lightning.fit``)."""

    num: int
    label: str
    slot: str  # "GPU 0", "CPU 3"
    started_at: float
    epoch: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepSnapshot:
    """The sweep at one moment."""

    at: float
    started_at: float
    slots: int
    done: int
    failed: int
    skipped: int
    pruned: int
    retrying: int
    queued: int  # submitted, waiting for a slot, plus what the sweeper will still submit
    running: tuple[RunningJob, ...]
    mean_job_s: float | None  # over the jobs that ran to an end
    best: str | None  # the sweeper's best so far, as it words it

    @property
    def elapsed_s(self) -> float:
        return self.at - self.started_at

    @property
    def eta_s(self) -> float | None:
        """Seconds until the known jobs are done, from the mean duration of finished ones."""
        if self.mean_job_s is None or self.slots <= 0:
            return None
        mean = self.mean_job_s
        left = sum(max(mean - (self.at - job.started_at), 0.0) for job in self.running)
        return (left + self.queued * mean) / self.slots


class SweepTally:
    """Counts a sweep's jobs by what happened to them; fed by events, read by snapshots."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._slots = slots  # jobs that run at once; ``slots_open`` when they change
        self._started_at = time.time()
        self._done = self._failed = self._skipped = self._pruned = self._retrying = 0
        self._waiting = 0  # submitted to the executor, not started yet
        self._to_come = 0  # what the sweeper says it will still submit
        self._running: dict[str, RunningJob] = {}
        self._ran_s = 0.0
        self._ran = 0
        self._best: str | None = None

    # -- what the launcher says ---------------------------------------------------------

    def submitted(self, count: int = 1) -> None:
        with self._lock:
            self._waiting += count

    def skipped(self, count: int = 1) -> None:
        with self._lock:
            self._skipped += count

    # -- what the sweeper says ----------------------------------------------------------

    def sweeper_status(
        self, to_come: int | None = None, best: str | None = None, pruned: int | None = None
    ) -> None:
        """Jobs the sweeper will still submit, its best result so far, jobs it pruned (of
        those counted done: a pruned trial's job ended normally)."""
        with self._lock:
            if to_come is not None:
                self._to_come = max(to_come, 0)
            if best is not None:
                self._best = best
            if pruned is not None:
                self._pruned = pruned

    # -- the executor's events ----------------------------------------------------------

    def on_event(self, event: JobEvent) -> None:
        job = event.job
        with self._lock:
            if event.kind is EventKind.STARTED:
                if job.attempts <= 1:
                    self._waiting = max(self._waiting - 1, 0)
                else:
                    self._retrying = max(self._retrying - 1, 0)
                self._running[job.key] = RunningJob(job.num, job.label, _slot_name(job), event.at)
            elif event.kind is EventKind.PROGRESS and event.progress is not None:
                running = self._running.get(job.key)
                if running is not None:
                    self._running[job.key] = RunningJob(
                        running.num,
                        running.label,
                        running.slot,
                        running.started_at,
                        event.progress.epoch,
                        dict(event.progress.metrics),
                    )
            elif event.kind in (EventKind.RETRYING, EventKind.PREEMPTED):
                self._running.pop(job.key, None)
                self._retrying += 1
            elif event.kind is EventKind.ENDED:
                self._ended(job, event.at)

    def _ended(self, job: Job, at: float) -> None:
        running = self._running.pop(job.key, None)
        if running is None and job.started_at is None:
            self._waiting = max(self._waiting - 1, 0)  # cancelled before it started
        if running is not None and job.state in (JobState.COMPLETED, JobState.FAILED):
            self._ran_s += at - running.started_at  # a crash's duration says nothing of a job's
            self._ran += 1

    def finished(self, ok: bool) -> None:
        """A job's outcome, as its JobReturn says (a task that raised is FAILED for Hydra
        though its process ended normally): counted once the launcher has it."""
        with self._lock:
            if ok:
                self._done += 1
            else:
                self._failed += 1

    # -- reading ------------------------------------------------------------------------

    def slots_open(self, slots: int) -> None:
        """Jobs run this many at a time now (``jobs_per_gpu=auto`` opened or closed slots)."""
        with self._lock:
            self._slots = slots

    def snapshot(self) -> SweepSnapshot:
        with self._lock:
            return SweepSnapshot(
                at=time.time(),
                started_at=self._started_at,
                slots=self._slots,
                done=self._done,
                failed=self._failed,
                skipped=self._skipped,
                pruned=self._pruned,
                retrying=self._retrying,
                queued=self._waiting + self._retrying + self._to_come,
                running=tuple(sorted(self._running.values(), key=lambda j: j.num)),
                mean_job_s=self._ran_s / self._ran if self._ran else None,
                best=self._best,
            )


def _slot_name(job: Job) -> str:
    slot = job.slot
    if slot is None:
        return "?"
    if not slot.device:
        return f"CPU slot {slot.index}"
    return f"GPU{'s' if len(slot.devices) > 1 else ''} {slot.device}"
