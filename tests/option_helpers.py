"""Check plugin options in this process, as the plugins check them before anything runs.

Each test of a bad option that runs here has a sibling that runs the real CLI, proving that the
same error reaches the user through Hydra and stops the sweep before any job; these helpers
cover the other values in milliseconds instead of a process start each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from furcate_hydra.execution.slots import plan_slots
from furcate_hydra.store import check_tracking_uri, resolve_tracking_uri
from hydra_plugins.furcate_launcher.config import FurcateLauncherConf
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper
from hydra_plugins.furcate_sweeper.furcate_sweeper import FurcateSweeper


def check_launcher_options(partial: Mapping[str, Any]) -> None:
    """What the launcher checks before any job runs, for ``hydra.launcher`` set to ``partial``
    over the defaults: the slot plan (in this process's environment), the pool and store
    options, and that the tracking store can be used.

    Raises:
        FurcateConfigError: the complaint the CLI prints (key, value, problem, fix).
    """
    # Hydra hands the launcher its node typed by the config dataclass (0 becomes 0.0 for a
    # float field); merging into the structured config does the same.
    options: Any = OmegaConf.to_container(
        OmegaConf.merge(OmegaConf.structured(FurcateLauncherConf), dict(partial))
    )
    parsed = FurcateLauncher.parse_options(options)
    plan_slots(parsed.slots)
    if parsed.store.enabled:
        check_tracking_uri(resolve_tracking_uri(parsed.store.tracking_uri))


def parse_launcher_options(options: Mapping[str, Any]) -> Any:
    """``hydra/launcher=furcate``'s parse of a complete options mapping, as given (no typing
    by the config dataclass: values Hydra would coerce reach the check as they are)."""
    defaults: Any = OmegaConf.to_container(OmegaConf.structured(FurcateLauncherConf))
    return FurcateLauncher.parse_options({**defaults, **options})


def parse_grid_sweeper_options(options: Mapping[str, Any]) -> Any:
    """``hydra/sweeper=furcate``'s check of its options, as its ``setup`` runs it."""
    return FurcateSweeper.parse_options(options)


def parse_optuna_sweeper_options(options: Mapping[str, Any]) -> Any:
    """``hydra/sweeper=furcate_optuna``'s check of its options, as its ``setup`` runs it."""
    return FurcateOptunaSweeper.parse_options(options)
