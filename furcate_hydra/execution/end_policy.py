"""What becomes of a job whose process ended: handed back, or queued again.

    ended ──► cancelled by the pool ─────────────────────────────► CANCELLED
          ──► could not start ───────────────────────────────────► FAILED
          ──► the machinery under it died, or its process crashed ► retries left? RETRYING
                                                                    : CRASHED
          ──► preempted (it saved, or a preemption signal) ──────► within the limit? PREEMPTED
                                                                    (queued) : PREEMPTED
          ──► out of GPU memory beside others (GpuPacking judges) ► RETRYING, or FAILED
          ──► its report: a value ► COMPLETED; an error ► FAILED

A retry for a crash counts against ``max_retries``; a preemption against ``max_preemptions``
only; running out of GPU memory beside other jobs against neither. The pool applies the
outcome (``execution.job_pool``); this module only decides it.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from furcate_hydra.execution.executor import EventKind
from furcate_hydra.execution.exits import describe_wait_status
from furcate_hydra.execution.forkserver.protocol import ChildReport
from furcate_hydra.execution.gpu.out_of_memory import cuda_out_of_memory, stderr_size
from furcate_hydra.execution.gpu.packing import GpuPacking
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.transport import Ended
from furcate_hydra.preemption import PREEMPTION_SIGNALS

__all__ = ["EndPolicy", "HandBack", "Outcome", "QueueAgain"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandBack:
    """The job ends here, in ``state``: with ``value`` (COMPLETED) or ``error``."""

    state: JobState
    error: str | None = None
    value: Any = None


@dataclass(frozen=True)
class QueueAgain:
    """The job goes back first in the queue, told to the listeners as ``kind`` with ``why``."""

    kind: EventKind
    why: str


Outcome = HandBack | QueueAgain


class EndPolicy:
    """The retry, preemption, crash and out-of-memory rules of one pool (see the module doc)."""

    def __init__(self, options: PoolOptions, packing: GpuPacking | None = None) -> None:
        """``packing``: for GPU slots; a job that ran out of GPU memory is its to judge."""
        self.options = options
        self.packing = packing
        self._stderr_from: dict[str, int] = {}  # packed jobs: where their attempt's stderr starts

    def placing(self, job: Job) -> None:
        """An attempt of the job is about to be placed: out of memory is read from its stderr
        from here on."""
        if self.packing is not None:
            self._stderr_from[job.key] = stderr_size(job.paths.stderr)

    def outcome(self, job: Job, ended: Ended, cancelled: bool, may_retry: bool) -> Outcome:
        """What the job becomes. ``cancelled``: the pool stopped it; ``may_retry``: the pool
        still runs, so a crashed job may run again."""
        report = ended.report
        if cancelled:
            # the pool's own SIGTERM, though the job may have saved and said "preempted"
            if job.started_at is None:  # stopped before its process ran it
                return HandBack(JobState.CANCELLED, error="cancelled before it started")
            return HandBack(JobState.CANCELLED, error="stopped by the launcher")
        if ended.start_error is not None:
            return HandBack(JobState.FAILED, error=ended.start_error)
        if ended.died is not None:
            return self._crashed(job, ended.died, may_retry)
        if (why := preempted_by(report, ended.wait_status)) is not None:
            return self._preempted(job, why)
        if (oom := self._out_of_memory(job, report)) is not None:
            return self._on_out_of_memory(job, *oom)
        if report is not None and report.error is None:
            return HandBack(JobState.COMPLETED, value=report.value)
        if report is not None:
            return HandBack(JobState.FAILED, error=f"{report.error}\n{job.paths.see_logs()}")
        why = "the job's process ended without a result"
        if ended.wait_status is not None:
            why = describe_wait_status(ended.wait_status)
        return self._crashed(
            job, why if ended.where is None else f"{why} (on {ended.where})", may_retry
        )

    def ended(self, job: Job, report: ChildReport | None) -> None:
        """The job's outcome was told: its GPU learns its peak (a packed job's)."""
        if self.packing is not None:
            self._stderr_from.pop(job.key, None)
            self.packing.ended(job.key, report.gpu_peak_bytes if report is not None else None)

    def _out_of_memory(self, job: Job, report: ChildReport | None) -> tuple[str, bool] | None:
        """For a packed GPU job that did not complete: what said it ran out of GPU memory,
        and whether to queue it again (else it fails)."""
        if self.packing is None or job.slot is None or job.slot.device is None:
            return None
        error = None if report is None else report.error or report.failure
        if report is not None and error is None and report.exit_code is None:
            return None  # it completed
        since = self._stderr_from.get(job.key, 0)
        line = cuda_out_of_memory(error, job.paths.stderr, since)
        if line is None:
            return None
        verdict = self.packing.out_of_memory(job.key)
        return f"{verdict.why} ({line})", verdict.queue_again

    def _on_out_of_memory(self, job: Job, why: str, queue_again: bool) -> Outcome:
        """Not a failure where the GPU was shared: the job goes first in the queue again,
        without using a retry; alone on its GPU, it fails with that reason."""
        if not queue_again:
            return HandBack(JobState.FAILED, error=f"{why}\n{job.paths.see_logs()}")
        job.memory_retries += 1
        log.warning("Job %s %s; queued again", job.label or job.key, why)
        return QueueAgain(EventKind.RETRYING, why)

    def _crashed(self, job: Job, why: str, may_retry: bool) -> Outcome:
        """Retry the job if it has retries left (and the pool still runs), else CRASHED."""
        retries = job.attempts - job.preemptions - job.memory_retries
        if may_retry and retries <= self.options.max_retries:
            log.warning(
                "Job %s crashed (%s); retry %d of %d",
                job.label or job.key,
                why,
                retries,
                self.options.max_retries,
            )
            return QueueAgain(EventKind.RETRYING, why)
        return HandBack(JobState.CRASHED, error=f"{why}\n{job.paths.see_logs()}")

    def _preempted(self, job: Job, why: str) -> Outcome:
        """Queue a preempted job again, or, past the limit, hand it back PREEMPTED; it resumes
        from the checkpoint it saved, in its run."""
        job.preemptions += 1
        limit = self.options.max_preemptions
        if job.preemptions > limit:
            error = (
                f"preempted {job.preemptions} times, more than hydra.launcher.max_preemptions="
                f"{limit} allows (the last time: {why}); run the same command to resume it"
                f"\n{job.paths.see_logs()}"
            )
            return HandBack(JobState.PREEMPTED, error=error)
        log.warning(
            "Job %s %s; queued again to resume (preemption %d of %d)",
            job.label or job.key,
            why,
            job.preemptions,
            limit,
        )
        return QueueAgain(EventKind.PREEMPTED, why)


def preempted_by(report: ChildReport | None, wait_status: int | None) -> str | None:
    """What preempted a job, in words, or None: it raised JobPreempted (having saved), or a
    preemption signal killed it (a task that does not train through ``fit``)."""
    if report is not None:
        return report.preempted
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum in PREEMPTION_SIGNALS:
            name = signal.Signals(signum).name
            return (
                f"preempted by {name} (its process ended by it; it resumes from its last "
                "checkpoint)"
            )
    return None
