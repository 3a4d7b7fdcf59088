"""A Hydra app for the launcher-memory benchmark: each job returns its ``i`` at once, so the
launcher's own cost per job (composing, recording, handing back) is all there is."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="trivial")
def main(cfg: DictConfig) -> int:
    return int(cfg.i)


if __name__ == "__main__":
    main()
