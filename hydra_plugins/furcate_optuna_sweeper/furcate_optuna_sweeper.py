"""The furcate Optuna sweeper: Hydra's entry point; the work happens in ``_core``."""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class FurcateOptunaSweeper(Sweeper):
    """hydra-optuna-sweeper's study, run asynchronously on the furcate launcher's slots.

    Each free slot gets a trial the moment its last one is told; jobs report each epoch to
    their trial and stop when pruned; the study lives in a shared storage, so a rerun runs only
    the trials it is missing. With any other launcher, trials run in batches of ``n_jobs``.
    """

    def __init__(self, **options: Any) -> None:
        self.raw_options = options
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions

        # Validated here, not in __init__, where Hydra would wrap the error in its own.
        self.options = OptunaOptions.parse(self.raw_options)
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[list[JobReturn]]:
        from hydra_plugins.furcate_optuna_sweeper._core import run_study

        if self.hydra_context is None or self.config is None or self.launcher is None:
            raise RuntimeError("FurcateOptunaSweeper.setup() must be called before sweep()")
        return run_study(self.options, self.hydra_context, self.config, self.launcher, arguments)
