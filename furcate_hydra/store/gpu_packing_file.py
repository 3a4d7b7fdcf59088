"""``gpu_packing.json``: what ``jobs_per_gpu=auto`` learned, for ``furcate status`` to show.

    {"gpus": {"0": {"jobs_at_a_time": 5, "max_reached": 5, "peak_gib_per_job": 11.2,
                    "budget_gib": 79.1, "oom_backoffs": 0}},
     "lines": ["GPU 0: 5 at a time, peak 11.2 GiB per job"], "updated_at": 1764150000.0}

Written by the launcher as its GPUs' counts change, read by anyone; nothing imports the pool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes

__all__ = ["read_packing_lines", "write_packing"]


def write_packing(
    path: Path, gpus: Mapping[str, Mapping[str, float | int | str]], lines: list[str]
) -> None:
    """Replace the file with what is known now (atomically: a reader never sees half)."""
    data = {"gpus": dict(gpus), "lines": lines, "updated_at": time.time()}
    atomic_write_bytes(path, json.dumps(data, indent=1).encode(), durable=False)


def read_packing_lines(path: Path) -> list[str]:
    """The lines of a sweep's file; [] where there is none (no ``jobs_per_gpu=auto``) or it
    cannot be read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    lines = data.get("lines") if isinstance(data, dict) else None
    return [str(line) for line in lines] if isinstance(lines, list) else []
