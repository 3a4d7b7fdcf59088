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
from furcate_hydra.hydra_layer.launch_session import pool_options, slot_options
from furcate_hydra.hydra_layer.recording import StoreOptions
from furcate_hydra.store import check_tracking_uri, resolve_tracking_uri
from hydra_plugins.furcate_launcher.config import FurcateLauncherConf


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
    plan_slots(slot_options(options))
    pool_options(options)
    store = StoreOptions.parse(options)
    if store.enabled:
        check_tracking_uri(resolve_tracking_uri(store.tracking_uri))


def parse_grid_sweeper_options(options: Mapping[str, Any]) -> Any:
    """``hydra/sweeper=furcate``'s check of its options, as its ``setup`` runs it."""
    from hydra_plugins.furcate_sweeper._core import SweepOptions

    return SweepOptions.parse(dict(options))


def parse_optuna_sweeper_options(options: Mapping[str, Any]) -> Any:
    """``hydra/sweeper=furcate_optuna``'s check of its options, as its ``setup`` runs it."""
    from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions

    return OptunaOptions.parse(options)
