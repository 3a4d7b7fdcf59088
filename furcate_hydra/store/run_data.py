"""furcate's per-job ``run_data.json`` and per-sweep ``run_data.csv``, written atomically."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from furcate_hydra.atomic import atomic_write_bytes

__all__ = [
    "JobRow",
    "jsonable",
    "update_run_data_metrics",
    "write_ordered_run_data_csv",
    "write_run_data_csv",
    "write_run_data_json",
]


@dataclass
class JobRow:
    """One job of a sweep as it ended (or was skipped)."""

    job_num: int
    overrides: list[str]
    status: str  # FINISHED / FAILED / KILLED, as recorded in MLflow
    skipped: bool
    run_id: str | None
    fingerprint: str
    output_dir: str
    return_value: Any = None
    error: str | None = None
    start: float | None = None
    end: float | None = None
    resumed: bool = False
    # the highest resident memory (MiB) of its processes and GPU memory (MiB) they held, from
    # the launcher's resource trace (None: not traced, or no sample)
    rss_peak_mb: float | None = None
    gpu_mem_peak_mb: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return round(self.end - self.start, 3)


def write_run_data_json(
    path: Path, row: JobRow, config: Mapping[str, Any], details: Mapping[str, Any]
) -> None:
    """The job's config, timings and results, for people and scripts reading the output dir."""
    data = {
        **asdict(row),
        "duration_s": row.duration_s,
        "return_value": jsonable(row.return_value),
        "config": config,
        **details,
    }
    atomic_write_bytes(path, json.dumps(data, indent=2, default=str).encode("utf-8"), durable=False)


def update_run_data_metrics(path: Path, metrics: Mapping[str, float]) -> None:
    """Put a run's final metrics into its job's ``run_data.json`` (read from the store after the
    job ended); a file that is not there or not readable is left alone."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    data["metrics"] = dict(metrics)
    atomic_write_bytes(path, json.dumps(data, indent=2, default=str).encode("utf-8"), durable=False)


def write_run_data_csv(path: Path, rows: Sequence[JobRow]) -> None:
    """One row per job, metric columns the union over jobs, ordered by job number."""
    names = {name for row in rows for name in row.metrics}
    write_ordered_run_data_csv(path, sorted(rows, key=lambda r: r.job_num), names)


def write_ordered_run_data_csv(
    path: Path, rows: Iterable[JobRow], metric_names: Collection[str]
) -> None:
    """``write_run_data_csv`` of rows already in job order, read once, whose metrics are
    among ``metric_names``: a whole sweep's rows need not be in memory at once."""
    fixed = [
        "job_num",
        "overrides",
        "status",
        "skipped",
        "resumed",
        "return_value",
        "start",
        "end",
        "duration_s",
        "rss_peak_mb",
        "gpu_mem_peak_mb",
        "run_id",
        "fingerprint",
        "output_dir",
        "error",
    ]
    # A metric named like a fixed column (``status``, ``end``) must not overwrite it.
    names = sorted(metric_names)
    column = {name: f"metric:{name}" if name in fixed else name for name in names}
    columns = [*fixed[:6], *column.values(), *fixed[6:]]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                **asdict(row),
                **{column[name]: value for name, value in row.metrics.items()},
                "overrides": " ".join(row.overrides),
                "return_value": json.dumps(jsonable(row.return_value)),
                "duration_s": row.duration_s,
                "error": (row.error or "").splitlines()[0] if row.error else "",
            }
        )
    atomic_write_bytes(path, buffer.getvalue().encode("utf-8"), durable=False)


def jsonable(value: Any) -> Any:
    """``value`` if JSON can hold it, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
