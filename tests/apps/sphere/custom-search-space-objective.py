"""The task of hydra-optuna-sweeper's custom search space example: a sphere in four dimensions,
two of them suggested by ``configure`` (``hydra.sweeper.custom_search_space``)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig
from optuna.trial import Trial


@hydra.main(version_base=None, config_path="custom-search-space", config_name="config")
def multi_dimensional_sphere(cfg: DictConfig) -> float:
    return sum(float(cfg[name]) ** 2 for name in ("w", "x", "y", "z"))


def configure(cfg: DictConfig, trial: Trial) -> None:
    """z near the sampled x; w is not in the task's config, hence the ``+``."""
    x = trial.params["x"]
    spread = cfg.max_z_difference_from_x
    trial.suggest_float("z", x - spread, x + spread)
    trial.suggest_float("+w", 0.0, 1.0)


if __name__ == "__main__":
    multi_dimensional_sphere()
