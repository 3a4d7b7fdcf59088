"""A Hydra app for the start-up bench whose task module imports nothing heavy: a job sleeps
``d`` seconds and writes ``times.json`` into its output dir: its number, its slot, when its
task's first line ran and when it ended, and when its module's imports were done."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

# When the module's imports were done: the bench counts a job's start from here as well, which
# leaves out how long the imports took (seconds for torch, varying with the page cache).
IMPORTED_AT = time.time()


@hydra.main(version_base="1.3", config_path="conf", config_name="startup")
def main(cfg: DictConfig) -> int:
    started = time.time()  # the first line: when the job started, as the bench counts it
    time.sleep(float(cfg.d))
    hydra_cfg = HydraConfig.get()
    info = {
        "num": int(hydra_cfg.job.num),
        "slot": os.environ.get("FURCATE_SLOT"),
        "started_at": started,
        "ended_at": time.time(),
        "imported_at": IMPORTED_AT,
    }
    (Path(hydra_cfg.runtime.output_dir) / "times.json").write_text(json.dumps(info))
    return int(cfg.i)


if __name__ == "__main__":
    main()
