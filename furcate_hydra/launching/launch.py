"""Hydra's ``Launcher.launch`` over a session: a batch checked, then streamed chunk by chunk.

launch(overrides...) ──► every job's dir and log inside the sweep dir? (check_batch_paths, before
                        the pool starts; job_dirs) ──► else refused, nothing runs
                    ──► submit_batch: the first chunk fills the idle slots, later ones are
                        composed and looked up while those jobs run
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
from furcate_hydra.launching.streaming import LOOKUP_CHUNK, JobRequest

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
    requests = [JobRequest(o, initial_job_idx + i) for i, o in enumerate(job_overrides)]
    with session.streaming():
        slots = session.executor.slot_count
        log.info("Launching %d jobs on %d slots", len(requests), slots)
        keys: list[str] = []
        returns: dict[str, JobReturn] = {}
        # The first chunk fills the idle slots at once; later ones are composed and looked
        # up while those jobs run.
        chunk = max(session.idle_slots, 1)
        while requests:
            keys += [job.key for job in session.submit_batch(requests[:chunk])]
            requests = requests[chunk:]
            chunk = LOOKUP_CHUNK
            returns.update(session.wait_any(timeout=0))
        while len(returns) < len(keys):
            returns.update(session.wait_any())
    return [returns[key] for key in keys]
