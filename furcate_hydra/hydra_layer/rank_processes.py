"""Lightning's DDP launchers inside a furcate job: the ranks it starts run this job, not the sweep.

    job's process, right before the task (``prepare_for_ranks``):
      sys.argv ──► <script> <this job's overrides> hydra.mode=RUN +hydra.callbacks.furcate_ranks
      HydraConfig.run.dir ──► the job's dir
    Lightning's subprocess launcher (strategy=ddp, FSDP) in the task, for ranks 1..N-1:
      python <script> sys.argv[1:] hydra.run.dir=<run.dir> hydra.job.name=train_ddp_process_<r>
             hydra.output_subdir=null
      ──► a single run of this job's config, in the job's dir; ``RankStart`` there does what
          the job's process did before its task (hydra.launcher.lightning=auto), so every rank's
          Trainer gets the same callbacks (a collective one rank lacks would hang the others)

Under a multirun, ``sys.argv[1:]`` is the whole sweep: each rank would start a sweep of its
own, whose jobs' ranks meet in one process group. ``ddp_spawn`` pickles the Trainer into fresh
processes instead and needs none of this, only picklable callbacks.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from furcate_hydra.lightning_auto import install_for_job

__all__ = ["RankStart", "prepare_for_ranks", "rank_overrides"]

# Hydra overrides a rank must not take from its job: the sweep's, and what Lightning sets
_NOT_FOR_RANKS = (
    *("hydra.sweep.", "hydra.mode", "hydra.run.dir", "hydra.job.name", "hydra.output_subdir"),
    *("hydra/sweeper", "hydra.sweeper."),
)
_CALLBACK = f"+hydra.callbacks.furcate_ranks._target_={__name__}.RankStart"
_SERVER = "furcate_hydra.execution.forkserver"


def rank_overrides(config: DictConfig) -> list[str]:
    """The command-line overrides that compose this job's config as a single run."""
    overrides = config.hydra.overrides
    hydra = [o for o in overrides.hydra if not str(o).lstrip("+~").startswith(_NOT_FOR_RANKS)]
    return [*map(str, overrides.task), *map(str, hydra), "hydra.mode=RUN", _CALLBACK]


def prepare_for_ranks(config: DictConfig, task_function: Any) -> None:
    """Make the job's process look, to Lightning's subprocess launcher, like a single run of
    this job: its command line and its run dir. Only this job's process is changed."""
    main = sys.modules.get("__main__")
    script = sys.argv[0] if sys.argv else ""
    spec = getattr(main, "__spec__", None)
    if spec is not None and str(spec.name).startswith(_SERVER):
        # a fork server started as its own interpreter: the app's script is the task's file
        main.__spec__ = None  # type: ignore[union-attr]
        script = inspect.getfile(task_function)
    sys.argv = [script, *rank_overrides(config)]
    hydra: Any = HydraConfig.instance().cfg  # the job's config, its hydra node only
    if hydra is not None:
        read_only = OmegaConf.is_readonly(hydra.hydra)
        OmegaConf.set_readonly(hydra.hydra, False)
        hydra.hydra.run.dir = config.hydra.runtime.output_dir
        OmegaConf.set_readonly(hydra.hydra, read_only)


class RankStart(Callback):
    """In a rank process Lightning started for a furcate job: what the job's process does
    before its task (its Trainer gets furcate's callbacks under lightning=auto)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        install_for_job()
