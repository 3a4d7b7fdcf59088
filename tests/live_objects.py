"""A Hydra callback for tests: how many objects of some classes the process running the sweeper
and the launcher holds, counted with ``gc`` when the multirun starts and when it ends (the
sweeper's returns still held). Written as JSON to ``out``: ``{class name: [start, end]}``."""

from __future__ import annotations

import collections
import gc
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

# What a launcher or a sweeper could keep per job: counted by class name, as Hydra may load a
# plugin's module twice.
COUNTED = ("Job", "JobReturn", "JobRow", "DictConfig", "TrialJob")


def _count() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(
        name for o in gc.get_objects() if (name := type(o).__name__) in COUNTED
    )


class LiveObjects(Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.at_start: dict[str, int] = {}

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self.at_start = dict(_count())

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        at_end = _count()
        counts = {name: [self.at_start.get(name, 0), at_end[name]] for name in COUNTED}
        Path(self.out).write_text(json.dumps(counts))
