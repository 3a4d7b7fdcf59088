"""What furcate's sweepers share with each other as Hydra plugins.

Abstract on purpose: Hydra's plugin scan registers every concrete ``Plugin`` class a plugin
module holds, imported ones included, and skips abstract ones.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from furcate_hydra.layout import SweepPaths

__all__ = ["SweepContext", "SweeperBase", "save_multirun_config"]

OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class SweepContext:
    """What Hydra gave the sweeper in ``setup``: all a sweep needs besides its options."""

    hydra_context: HydraContext
    config: DictConfig
    launcher: Launcher


class SweeperBase(Sweeper, Generic[OptionsT], abc.ABC):
    """Options validated in ``setup`` (a bad one stops the app with a plain message before the
    launcher starts anything), the configured launcher instantiated, then ``run``."""

    def __init__(self, **options: Any) -> None:
        self.raw_options = options
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None

    @classmethod
    @abc.abstractmethod
    def parse_options(cls, options: Mapping[str, Any]) -> OptionsT:
        """``hydra.sweeper`` as typed options; raises OptionError for a bad value."""

    @abc.abstractmethod
    def run(self, options: OptionsT, context: SweepContext, arguments: Sequence[str]) -> Any:
        """The sweep itself: Hydra's ``sweep`` once ``setup`` ran."""

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        # Here, not in __init__, where Hydra would wrap the error in its own.
        self.options = self.parse_options(self.raw_options)
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        if self.hydra_context is None or self.config is None or self.launcher is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must be called before sweep()")
        context = SweepContext(self.hydra_context, self.config, self.launcher)
        returns: list[Sequence[JobReturn]] = self.run(self.options, context, arguments)
        return returns


def save_multirun_config(config: DictConfig) -> SweepPaths:
    """Create the sweep dir and write ``multirun.yaml`` there, as Hydra's sweepers do."""
    sweep = SweepPaths.of(str(config.hydra.sweep.dir))
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, sweep.multirun_yaml)
    return sweep
