"""Hydra's ``Launcher.launch`` over a session: a batch checked, then streamed chunk by chunk.

launch(overrides...) ──► every job's dir and log inside the sweep dir? (check_batch_paths, before
                        the pool starts; job_dirs) ──► else refused, nothing runs
                    ──► a SlotFeed submits it all: the first chunk fills the idle slots,
                        later ones are composed and looked up while those jobs run
                    ──► wait_any until every job came back ──► JobReturns in input order
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from furcate_hydra.hydra_api.task_config import as_job
from furcate_hydra.launching.compose import SweepComposer
from furcate_hydra.launching.job_dirs import check_job_paths
from furcate_hydra.launching.requested_jobs import job_config, job_name
from furcate_hydra.launching.slot_feed import FeedPace, JobSource, SlotFeed
from furcate_hydra.launching.streaming import JobRequest, JobRun

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn

    from furcate_hydra.launching.launch_session import LaunchSession

log = logging.getLogger(__name__)

__all__ = ["check_batch_paths", "launch"]


def check_batch_paths(
    composer: SweepComposer,
    sweep_dir: str,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> None:
    """Refuse a ``launch()`` batch of which a job would write outside the sweep dir, before
    any of it runs (Hydra's basic sweeper hands over the whole sweep at once). Each config is
    composed here and again when its chunk is submitted, so that no more than a chunk of
    configs is held at a time."""
    # No interrupts.check() here: the session's handlers are not installed yet, so a Ctrl-C is
    # Python's own KeyboardInterrupt, and a signal remembered by an earlier session in this
    # process is not this launch's.
    for i, overrides in enumerate(job_overrides):
        request = JobRequest(overrides, initial_job_idx + i)
        sweep_config = job_config(composer, request)
        with as_job(sweep_config):
            check_job_paths(sweep_config, sweep_dir, job_name(request))


def launch(
    session: LaunchSession, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Hydra's ``Launcher.launch``: submit every job, return JobReturns in input order."""
    batch = _Batch([JobRequest(o, initial_job_idx + i) for i, o in enumerate(job_overrides)])
    with session.streaming():
        at_once = session.executor.slot_count  # with fuse: every seat of every slot
        log.info("Launching %d jobs, up to %d at a time", len(batch.requests), at_once)
        # The first chunk fills the idle slots at once; later ones are composed and looked
        # up while those jobs run.
        pace = FeedPace(slots=max(session.idle_slots, 1), ahead=None)
        SlotFeed(_SessionTarget(session), batch, pace).run()
    return [batch.returns[i] for i in range(len(batch.requests))]


class _Batch(JobSource[int]):
    """A ``launch()`` batch as a feed's source: each job is its index in the batch."""

    def __init__(self, requests: list[JobRequest]) -> None:
        self.requests = requests
        self.returns: dict[int, JobReturn] = {}
        self._next = 0

    def has_more(self) -> bool:
        return self._next < len(self.requests)

    def take(self, count: int) -> list[tuple[JobRequest, int]]:
        first, self._next = self._next, min(self._next + count, len(self.requests))
        return [(self.requests[i], i) for i in range(first, self._next)]

    def ended(self, item: int, key: str, job_return: JobReturn) -> None:
        self.returns[item] = job_return


class _SessionTarget:
    """The session as a feed drives it: ``submit_batch`` hands back the jobs' keys."""

    def __init__(self, session: LaunchSession) -> None:
        self.session = session

    def submit_batch(self, jobs: Sequence[JobRequest]) -> list[str]:
        return [job.key for job in self.session.submit_batch(jobs)]

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        return self.session.wait_any(timeout)

    def job_run(self, key: str) -> JobRun:
        return self.session.job_run(key)

    @property
    def slot_count(self) -> int:
        return self.session.executor.slot_count
