"""``hydra/sweeper=furcate``: the options users set, registered in Hydra's ConfigStore."""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations, and OmegaConf reads the
# typing forms (Optional, List) to validate what users type.
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class FurcateSweeperConf:
    _target_: str = "hydra_plugins.furcate_sweeper.furcate_sweeper.FurcateSweeper"
    # the grid, as Hydra's basic sweeper takes it: key -> "a,b", choice(), range(), glob()
    params: Dict[str, str] = field(default_factory=dict)
    # furcate's exclude_configs: a config matching every pair of one mapping does not run;
    # keys are dotted config keys or config-group names, a list value means any of
    exclude: List[Any] = field(default_factory=list)
    # with a launcher that cannot stream, jobs per launch() batch (unset: all at once);
    # sweep returns are grouped in batches of this size either way
    max_batch_size: Optional[int] = None
    # follow edits of the primary config file's hydra.sweeper.params/exclude while running
    watch: bool = True
    # seconds between checks of the primary config file
    watch_interval_s: float = 1.0


ConfigStore.instance().store(
    group="hydra/sweeper", name="furcate", node=FurcateSweeperConf, provider="furcate_sweeper"
)
