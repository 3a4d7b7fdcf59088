"""The furcate Optuna sweeper: Hydra's entry point; the work happens in ``_core``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from furcate_hydra.sweepers.sweeper_base import SweepContext, SweeperBase

if TYPE_CHECKING:
    from furcate_hydra.sweepers.sweep_returns import ReturnBatch
    from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions


class FurcateOptunaSweeper(SweeperBase["OptunaOptions"]):
    """hydra-optuna-sweeper's study, run asynchronously on the furcate launcher's slots.

    Each free slot gets a trial the moment its last one is told; jobs report each epoch to
    their trial and stop when pruned; the study lives in a shared storage, so a rerun runs only
    the trials it is missing. With any other launcher, trials run in batches of ``n_jobs``.
    """

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> OptunaOptions:
        from furcate_hydra.hydra_api.options import with_defaults
        from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
        from hydra_plugins.furcate_optuna_sweeper.config import FurcateOptunaSweeperConf

        options = with_defaults(FurcateOptunaSweeperConf, options, "hydra/sweeper=furcate_optuna")
        return OptunaOptions.parse(options)

    def run(
        self, options: OptunaOptions, context: SweepContext, arguments: Sequence[str]
    ) -> list[ReturnBatch]:
        from hydra_plugins.furcate_optuna_sweeper._core import run_study

        return run_study(options, context, arguments)
