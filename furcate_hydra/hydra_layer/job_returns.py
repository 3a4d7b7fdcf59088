"""JobReturns for jobs that did not run to a report: skipped, crashed or stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

__all__ = ["synthetic_job_return"]


def synthetic_job_return(
    sweep_config: DictConfig, output_dir: Path, status: JobStatus, value: Any
) -> JobReturn:
    """What run_job would have returned, built in the launcher without running the task."""
    task_cfg = OmegaConf.masked_copy(sweep_config, [str(k) for k in sweep_config if k != "hydra"])
    overrides = OmegaConf.to_container(sweep_config.hydra.overrides.task)
    hydra_cfg = OmegaConf.create({"hydra": sweep_config.hydra})
    runtime = hydra_cfg.hydra.runtime
    with read_write(runtime), open_dict(runtime):
        runtime.output_dir = str(output_dir)
    job_return = JobReturn(
        overrides=list(overrides) if isinstance(overrides, list) else [],
        cfg=task_cfg,
        hydra_cfg=hydra_cfg,
        working_dir=str(output_dir) if _changes_dir(sweep_config) else os.getcwd(),
        task_name=str(sweep_config.hydra.job.name),
        status=status,
    )
    job_return.return_value = value
    return job_return


def _changes_dir(sweep_config: DictConfig) -> bool:
    # as run_job decides: unset chdir means True for apps on version_base < 1.2
    chdir = sweep_config.hydra.job.chdir
    if chdir is None:
        from hydra import version

        return not version.base_at_least("1.2")
    return bool(chdir)
