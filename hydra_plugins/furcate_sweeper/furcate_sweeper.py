"""The furcate grid sweeper: Hydra's entry point; the work happens in ``_core``."""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class FurcateSweeper(Sweeper):
    """Hydra's grid (``params`` and command-line sweeps) less furcate's exclusions.

    With the furcate launcher each slot gets its next job the moment its job ends; with any
    other launcher the grid runs in Hydra's batches. Edits of the primary config file's
    ``hydra.sweeper.params`` or ``exclude`` change what is still queued.
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

        from hydra_plugins.furcate_sweeper._core import SweepOptions

        # Validated here, not in __init__, where Hydra would wrap the error in its own: a bad
        # option stops the app with a plain message before the launcher starts anything.
        self.options = SweepOptions.parse(self.raw_options)
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[list[JobReturn]]:
        from hydra_plugins.furcate_sweeper._core import run_grid_sweep

        if self.hydra_context is None or self.config is None or self.launcher is None:
            raise RuntimeError("FurcateSweeper.setup() must be called before sweep()")
        return run_grid_sweep(
            self.options, self.hydra_context, self.config, self.launcher, arguments
        )
