"""A Hydra app for the Optuna makespan bench: a trial's job sleeps ``d`` seconds and returns
``(x - 0.3) ** 2`` to minimise. It writes ``trial.json`` into its output dir: its job number,
slot, ``d``, ``x``, when its process was entered (furcate's ``FURCATE_JOB_STARTED_AT``, set
after the fork) and when its task started and ended."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="optuna_sleep")
def main(cfg: DictConfig) -> float:
    started = time.time()
    duration = float(cfg.d)
    time.sleep(duration)
    hydra_cfg = HydraConfig.get()
    info = {
        "num": int(hydra_cfg.job.num),
        "duration": duration,
        "x": float(cfg.x),
        "slot": os.environ.get("FURCATE_SLOT"),
        "entered_at": float(os.environ.get("FURCATE_JOB_STARTED_AT", started)),
        "started_at": started,
        "ended_at": time.time(),
    }
    (Path(hydra_cfg.runtime.output_dir) / "trial.json").write_text(json.dumps(info))
    return (float(cfg.x) - 0.3) ** 2


if __name__ == "__main__":
    main()
