"""A job as requested of the launcher: its config composed, its name in messages and logs."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, open_dict

from furcate_hydra.launching.compose import SweepComposer
from furcate_hydra.launching.streaming import JobRequest

__all__ = ["job_config", "job_label", "job_name", "task_overrides"]


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
