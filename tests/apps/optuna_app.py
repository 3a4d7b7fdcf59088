"""A Hydra app for Optuna sweeper tests: a sphere to minimise, with knobs for timing and faults.

Records what its job saw (``probe.json``, as the probe app does). Job ``slow_job`` sleeps
``slow_s`` instead of ``sleep``, so a test can hold one slot busy while others turn over.
``returns`` picks how many values come back; ``mode=raise`` fails the job.
"""

from __future__ import annotations

import time
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from probe_app import record  # type: ignore[import-not-found]  # a sibling script


@hydra.main(version_base=None, config_path="conf", config_name="optuna")
def main(cfg: DictConfig) -> Any:
    if HydraConfig.get().job.num == cfg.slow_job:
        time.sleep(float(cfg.slow_s))
    record(cfg)
    if cfg.mode == "raise":
        raise ValueError("the task raised on purpose")
    value = (float(cfg.x) - 1.0) ** 2 + float(cfg.y) ** 2
    if cfg.returns == 2:
        return value, -value
    if cfg.returns == "none":
        return None
    return value


if __name__ == "__main__":
    main()
