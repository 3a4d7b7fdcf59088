"""How the commands write values: for people (tables, HTML) and as JSON."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from typing import Any

from furcate_hydra.store.sweep_snapshot import JobSnapshot, SweepSnapshot

__all__ = [
    "format_duration",
    "format_time",
    "format_value",
    "jsonable",
    "snapshot_json",
]


def format_value(value: Any, width: int = 60) -> str:
    """A value in a table cell: numbers to 4 significant digits, the rest as JSON, cut."""
    if value is None:
        return ""
    if isinstance(value, int):  # bools too
        text = str(value)
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(jsonable(value), separators=(", ", ": "))
    return text if len(text) <= width else text[: width - 1] + "…"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_time(timestamp: float | None) -> str:
    """Local time, to the second."""
    if timestamp is None:
        return ""
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def iso_time(timestamp: float | None) -> str | None:
    """UTC, ISO 8601 with its offset: what a script reading the JSON can parse."""
    if timestamp is None:
        return None
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds")


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: numpy scalars and arrays as numbers and lists, tuples and
    sets as lists, NaN and infinities as null (JSON has none), anything else as its repr."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return [jsonable(v) for v in sorted(value, key=repr)]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return jsonable(value.tolist())
    return repr(value)


def job_json(job: JobSnapshot) -> dict[str, Any]:
    progress = job.progress
    return {
        "job_num": job.job_num,
        "overrides": list(job.overrides),
        "status": job.status.value,
        "error": job.error,
        "start": iso_time(job.start),
        "duration_s": job.duration_s,
        "return_value": jsonable(job.return_value),
        "metrics": jsonable(job.metrics),
        "run_id": job.run_id,
        "output_dir": job.output_dir,
        "resumed": job.resumed,
        "rss_peak_mb": job.rss_peak_mb,
        "gpu_mem_peak_mb": job.gpu_mem_peak_mb,
        "ran_in": job.ran_in,
        "progress": None
        if progress is None
        else {"epoch": progress.epoch, "step": progress.step, "at": iso_time(progress.at)},
    }


def snapshot_json(snapshot: SweepSnapshot) -> dict[str, Any]:
    """``furcate status --json``: ``counts`` (every status), ``jobs``, and ``sweep``."""
    return {
        "sweep": {
            "dir": str(snapshot.sweep_dir),
            "status": snapshot.status,
            "reason": snapshot.reason,
            "tracking_uri": snapshot.tracking_uri,
            "experiment": snapshot.experiment,
            "run_id": snapshot.sweep_run_id,
            "command": snapshot.command,
            "start": iso_time(snapshot.start),
            "end": iso_time(snapshot.end),
        },
        "counts": {status.value: n for status, n in snapshot.counts().items()},
        "jobs": [job_json(job) for job in snapshot.jobs],
    }
