"""A Hydra app for the exit tests: its task returns ``i``. At the very end of its process (an
exit handler registered at import, before the launcher's, so run after it) it writes into
``$EXIT_REPORT`` whether the heap was frozen and whether the sqlite store's WAL file was still
there (a connection to it still open)."""

from __future__ import annotations

import atexit
import gc
import json
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig


def _report() -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    store = Path(uri.removeprefix("sqlite:///"))
    seen = {"frozen": gc.get_freeze_count(), "wal_left": Path(f"{store}-wal").exists()}
    Path(os.environ["EXIT_REPORT"]).write_text(json.dumps(seen))


atexit.register(_report)


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg: DictConfig) -> int:
    return int(cfg.i)


if __name__ == "__main__":
    main()
