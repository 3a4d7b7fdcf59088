"""A Hydra app for the learned-preload bench that imports torch and pytorch_lightning inside
its main function, as apps that keep ``--help`` and ``--cfg`` quick do: its launcher never has
them. A job writes ``times.json`` into its output dir: its number, when its task's first line
ran, when its imports were done (as fast as its process had them already) and when it ended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="startup")
def main(cfg: DictConfig) -> int:
    started = time.time()  # the task's first line
    import pytorch_lightning  # noqa: F401
    import torch

    imported = time.time()
    total = int(torch.arange(int(cfg.i) + 1).sum())
    time.sleep(float(cfg.d))
    hydra_cfg = HydraConfig.get()
    info = {
        "num": int(hydra_cfg.job.num),
        "started_at": started,
        "imported_at": imported,
        "ended_at": time.time(),
    }
    (Path(hydra_cfg.runtime.output_dir) / "times.json").write_text(json.dumps(info))
    return total


if __name__ == "__main__":
    main()
