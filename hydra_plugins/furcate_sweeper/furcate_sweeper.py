"""The furcate grid sweeper: Hydra's entry point; the work happens in ``_core``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from furcate_hydra.sweepers.sweeper_base import SweepContext, SweeperBase

if TYPE_CHECKING:
    from furcate_hydra.sweepers.sweep_returns import ReturnBatch
    from hydra_plugins.furcate_sweeper._core import SweepOptions


class FurcateSweeper(SweeperBase["SweepOptions"]):
    """Hydra's grid (``params`` and command-line sweeps) less furcate's exclusions.

    With the furcate launcher each slot gets its next job the moment its job ends; with any
    other launcher the grid runs in Hydra's batches. Edits of the primary config file's
    ``hydra.sweeper.params`` or ``exclude`` change what is still queued.
    """

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> SweepOptions:
        from furcate_hydra.hydra_api.options import with_defaults
        from hydra_plugins.furcate_sweeper._core import SweepOptions
        from hydra_plugins.furcate_sweeper.config import FurcateSweeperConf

        return SweepOptions.parse(
            with_defaults(FurcateSweeperConf, options, "hydra/sweeper=furcate")
        )

    def run(
        self, options: SweepOptions, context: SweepContext, arguments: Sequence[str]
    ) -> list[ReturnBatch]:
        from hydra_plugins.furcate_sweeper._core import run_grid_sweep

        return run_grid_sweep(options, context, arguments)
