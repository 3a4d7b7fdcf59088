"""The task of hydra-optuna-sweeper's example: x² + y², failing when ``error`` is set."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def sphere(cfg: DictConfig) -> float:
    if cfg.get("error", False):
        raise RuntimeError("cfg.error is True")
    return float(cfg.x) ** 2 + float(cfg.y) ** 2


if __name__ == "__main__":
    sphere()
