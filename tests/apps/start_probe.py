"""A Hydra callback for start-up tests: when the multirun ends (the launcher not yet closed),
write which heavy modules the launcher's process has imported and which processes it runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

WATCHED = ("mlflow", "sqlalchemy", "torch")


class StartProbe(Callback):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        children = psutil.Process().children()
        info = {
            "modules": [name for name in WATCHED if name in sys.modules],
            "children": [child.name() for child in children],
        }
        self.path.write_text(json.dumps(info))
