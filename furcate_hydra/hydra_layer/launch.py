"""Hydra's ``Launcher.launch`` over a session: a batch checked, then streamed chunk by chunk.

launch(overrides...) ──► every job's dir and log inside the sweep dir? (check_batch_paths, before
                        the pool starts; job_dirs) ──► else refused, nothing runs
                    ──► submit_batch: the first chunk fills the idle slots, later ones are
                        composed and looked up while those jobs run
                    ──► wait_any until every job came back ──► JobReturns in input order
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

from omegaconf import DictConfig, open_dict

from furcate_hydra.hydra_layer.compose import SweepComposer
from furcate_hydra.hydra_layer.job_dirs import check_job_paths
from furcate_hydra.hydra_layer.streaming import LOOKUP_CHUNK, JobRequest
from furcate_hydra.hydra_layer.task_config import as_job
from furcate_hydra.scheduling import StreamCounts

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn

    from furcate_hydra.hydra_layer.launch_session import LaunchSession
    from furcate_hydra.store import CodeVersion

log = logging.getLogger(__name__)

__all__ = [
    "check_batch_paths",
    "job_config",
    "job_label",
    "job_name",
    "launch",
    "log_interrupted",
    "log_stream_counts",
    "task_overrides",
]


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


def log_stream_counts(counts: StreamCounts, code: CodeVersion | None) -> None:
    """The closing lines of a stream: what ran elsewhere, what was skipped, and why."""
    if counts.ran_elsewhere:
        log.info(
            "furcate: %d of %d configs ran in other launchers (their MLflow runs are the record)",
            counts.ran_elsewhere,
            counts.submitted,
        )
    if counts.skipped:
        log.info(
            "furcate: skipped %d of %d configs already recorded in MLflow",
            counts.skipped,
            counts.submitted,
        )
    if counts.skipped_other_code:
        log.warning(
            "furcate: %d of the %d skipped configs were finished by other code than this "
            "sweep's (%s); set hydra.launcher.code_change=rerun to run them again",
            counts.skipped_other_code,
            counts.skipped,
            code.key if code is not None else "unknown",
        )


def log_interrupted(signum: int, stopped: int, sweep_dir: object) -> None:
    """What a Ctrl-C or SIGTERM stopped, and how to resume."""
    log.warning(
        "furcate: interrupted (%s): %d job%s stopped and recorded as KILLED, the "
        "sweep's records written to %s; run the same command to resume",
        signal.Signals(signum).name,
        stopped,
        "" if stopped == 1 else "s",
        sweep_dir,
    )


def task_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides of the task's config: Hydra's ``filter_overrides`` misses ``+hydra.*`` and
    ``++hydra.*`` (how a sweeper passes a job its environment through any launcher)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]


def job_config(composer: SweepComposer, request: JobRequest) -> DictConfig:
    """A requested job's config, composed, with its ``hydra.job.num`` and ``id``."""
    sweep_config = composer.compose(request.overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = request.num
        sweep_config.hydra.job.num = request.num
    return sweep_config


def job_label(request: JobRequest) -> str:
    """The task's overrides as one line, for logs."""
    return " ".join(task_overrides(request.overrides))


def job_name(request: JobRequest) -> str:
    """The job as messages name it: ``job #3 (lr=0.1)``."""
    return f"job #{request.num} ({job_label(request) or 'no overrides'})"
