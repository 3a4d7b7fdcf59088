"""A Hydra app for the benchmarks: job ``i`` sleeps ``durations[i]`` seconds and writes
``sleep.json`` into its output dir: its slot, when its process was entered (furcate's
``FURCATE_JOB_STARTED_AT``, set after the fork) and when its task started and ended."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="sleep")
def main(cfg: DictConfig) -> dict[str, Any]:
    started = time.time()
    duration = float(cfg.durations[int(cfg.i)])
    time.sleep(duration)
    info = {
        "i": int(cfg.i),
        "duration": duration,
        "slot": os.environ.get("FURCATE_SLOT"),
        "entered_at": float(os.environ.get("FURCATE_JOB_STARTED_AT", started)),
        "started_at": started,
        "ended_at": time.time(),
    }
    (Path(HydraConfig.get().runtime.output_dir) / "sleep.json").write_text(json.dumps(info))
    return info


if __name__ == "__main__":
    main()
