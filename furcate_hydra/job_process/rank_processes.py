"""Lightning's DDP launchers inside a furcate job: the ranks it starts run this job, not the sweep.

    launcher's process (``launch_env``): the app's script or module, and its -cp/-cn/-cd
    job's process, right before the task (``prepare_for_ranks``):
      sys.argv ──► <script> <the app's -cp/-cn/-cd> <this job's overrides> hydra.mode=RUN
                   +hydra.callbacks.furcate_ranks
      HydraConfig.run.dir ──► the job's dir
    Lightning's subprocess launcher (strategy=ddp, FSDP) in the task, for ranks 1..N-1:
      python <script> sys.argv[1:] hydra.run.dir=<run.dir> hydra.job.name=train_ddp_process_<r>
             hydra.output_subdir=null
      (run by a fork of the job's process as a new interpreter would run it, ``warm_ranks``,
      or by a new interpreter where a fork cannot)
      ──► a single run of this job's config, in the job's dir; ``RankStart`` there does what
          the job's process did before its task (hydra.launcher.lightning=auto), so every rank's
          Trainer gets the same callbacks (a collective one rank lacks would hang the others)

Under a multirun, ``sys.argv[1:]`` is the whole sweep: each rank would start a sweep of its
own, whose jobs' ranks meet in one process group. The flags that choose the primary config are
in no override: without them a rank composes the app's default config. Their relative paths
hold in a rank as they did in the app: ``-cp`` is read from the script's dir (Lightning gives
the script's absolute path), ``-cd`` from the working dir (Lightning starts the ranks in
Hydra's original one). ``ddp_spawn`` pickles the Trainer into fresh processes instead and
needs none of this, only picklable callbacks.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from furcate_hydra import env_vars
from furcate_hydra.hydra_api.command_line import primary_config_flags
from furcate_hydra.job_process.fresh_interpreter import task_entered
from furcate_hydra.job_process.lightning_auto import install_for_job

__all__ = ["RankStart", "launch_env", "prepare_for_ranks", "rank_overrides"]

# Hydra overrides a rank must not take from its job: the sweep's, and what Lightning sets
_NOT_FOR_RANKS = (
    *("hydra.sweep.", "hydra.mode", "hydra.run.dir", "hydra.job.name", "hydra.output_subdir"),
    *("hydra/sweeper", "hydra.sweeper."),
)
_CALLBACK = f"+hydra.callbacks.furcate_ranks._target_={__name__}.RankStart"


def rank_overrides(config: DictConfig) -> list[str]:
    """The command-line overrides that compose this job's config as a single run."""
    overrides = config.hydra.overrides
    hydra = [o for o in overrides.hydra if not str(o).lstrip("+~").startswith(_NOT_FOR_RANKS)]
    return [*map(str, overrides.task), *map(str, hydra), "hydra.mode=RUN", _CALLBACK]


def launch_env() -> dict[str, str]:
    """What the launcher's process tells each job of how the app was started (its script,
    or the module of ``python -m``, and the flags that chose its primary config): a job's
    process may be a fork server's, started its own way, whose command line says nothing of
    the app."""
    env = {}
    if sys.argv and os.path.isfile(sys.argv[0]):
        env[env_vars.APP_SCRIPT] = os.path.abspath(sys.argv[0])
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        env[env_vars.APP_MODULE] = str(spec.name)
    flags = primary_config_flags(sys.argv[1:])
    if flags:
        env[env_vars.APP_CONFIG_FLAGS] = json.dumps(flags)
    return env


def prepare_for_ranks(config: DictConfig) -> None:
    """Make the job's process look, to Lightning's subprocess launcher, like a single run of
    this job started as the app was: its command line (with the app's primary config), its
    ``__main__``, its run dir. Only this job's process is changed."""
    script = os.environ.get(env_vars.APP_SCRIPT) or (sys.argv[0] if sys.argv else "")
    module = os.environ.get(env_vars.APP_MODULE)
    main = sys.modules.get("__main__")
    if main is not None:  # Lightning runs `python -m <its spec's name>`, or the script
        main.__spec__ = importlib.machinery.ModuleSpec(module, None) if module else None
    flags = json.loads(os.environ.get(env_vars.APP_CONFIG_FLAGS, "[]"))
    sys.argv = [script, *flags, *rank_overrides(config)]
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
        task_entered()  # a warm rank's failure from now on is its task's
