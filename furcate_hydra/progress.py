"""A running job's progress, as a small file its launcher reads: written by the job, atomically.

    job (fit's ProgressFile) ──► <job dir>/progress.json ──► the executor polls it
                                                         ──► PROGRESS event, record.progress

A file rather than a message: any process that can read the job dir (the launcher, a status
command in another terminal) sees the latest progress, and a job needs no channel to report it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes

__all__ = ["JobProgress", "read_progress", "write_progress"]


@dataclass(frozen=True)
class JobProgress:
    """Where training is: epoch and global step, the latest scalar metrics, when it was said."""

    epoch: int
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    at: float = 0.0


def write_progress(
    path: Path, epoch: int, step: int, metrics: Mapping[str, float], at: float | None = None
) -> None:
    data = {"epoch": epoch, "step": step, "metrics": dict(metrics), "at": at or time.time()}
    # Rewritten often and worthless after a crash: no fsync.
    atomic_write_bytes(path, json.dumps(data).encode(), durable=False)


def read_progress(path: Path) -> JobProgress | None:
    """The progress in ``path``; None when there is none, or it is not a progress file."""
    try:
        data = json.loads(path.read_bytes())
        metrics = {str(k): float(v) for k, v in dict(data.get("metrics", {})).items()}
        return JobProgress(int(data["epoch"]), int(data["step"]), metrics, float(data["at"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
