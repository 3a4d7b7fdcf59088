"""What a finished sweep left on disk, as the GPU packing bench and the real-GPU tests read it.

    <sweep dir>/run_data.csv        ──► JobRun per job: status, start and end, job dir
    <sweep dir>/gpu_packing.json    ──► "gpus", per GPU: jobs_at_a_time, max_reached,
                                        peak_gib_per_job, budget_gib, oom_backoffs
                                        (jobs_per_gpu=auto; absent otherwise)
    <job dir>/trace.csv             ──► the job's NVML peak (gpu_mem_mb)
    <job dir>/attempts.jsonl        ──► each attempt of the job as the app saw it (start, end,
                                        "ok" or "oom"): the GPU apps write it (record_attempt)
    jobs' samples per time bucket   ──► the GPU's best aggregate samples/s (packed_rate), and
                                        its samples/s with n jobs training (rates_by_jobs)

Paths come from ``furcate_hydra.layout``, but ``attempts.jsonl``, which the apps write and
which is named here.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.tracing.samples import read_trace

__all__ = [
    "ATTEMPTS",
    "Attempt",
    "JobRun",
    "at_a_time",
    "max_over_gpus",
    "packed_rate",
    "rates_by_jobs",
    "read_attempts",
    "read_job_runs",
    "read_packing",
    "record_attempt",
    "trace_peak_mib",
]

ATTEMPTS = "attempts.jsonl"


@dataclass(frozen=True)
class JobRun:
    """One row of ``run_data.csv``: a job as the launcher recorded it."""

    num: int
    status: str
    start: float | None
    end: float | None
    output_dir: Path
    gpu_mem_peak_mb: float | None


@dataclass(frozen=True)
class Attempt:
    """One process of a job, from its task's first line to its end."""

    pid: int
    started_at: float
    ended_at: float
    outcome: str  # "ok" or "oom"


def read_job_runs(sweep_dir: Path) -> list[JobRun]:
    """The jobs of ``run_data.csv`` in job order; [] where the sweep wrote none."""
    path = SweepPaths.of(sweep_dir).run_data_csv
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [
        JobRun(
            num=int(row["job_num"]),
            status=row["status"],
            start=_number(row.get("start")),
            end=_number(row.get("end")),
            output_dir=Path(row["output_dir"]),
            gpu_mem_peak_mb=_number(row.get("gpu_mem_peak_mb")),
        )
        for row in rows
    ]


def read_packing(sweep_dir: Path) -> dict[str, dict[str, Any]] | None:
    """``gpu_packing.json``'s GPUs, {GPU id: its figures}, or None where the sweep wrote none
    (no ``jobs_per_gpu=auto``)."""
    path = SweepPaths.of(sweep_dir).gpu_packing
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        raise ValueError(f"{path}: expected an object with gpus: {{<GPU id>: ...}}, got {data!r}")
    return {str(gpu): dict(figures) for gpu, figures in gpus.items()}


def read_attempts(job_dir: Path) -> list[Attempt]:
    """The attempts the job's app recorded, in the order they ended."""
    path = job_dir / ATTEMPTS
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        Attempt(int(r["pid"]), float(r["started_at"]), float(r["ended_at"]), str(r["outcome"]))
        for r in records
    ]


def record_attempt(job_dir: Path, started_at: float, outcome: str) -> None:
    """Append one attempt of the job running in ``job_dir`` (its task's start, now as its end)
    to its attempts.jsonl: called by the GPU apps in the job's process."""
    line = {"pid": os.getpid(), "started_at": started_at, "ended_at": time.time()}
    # one write of one line to a file opened for appending: a reader never sees half of it
    fd = os.open(job_dir / ATTEMPTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, (json.dumps({**line, "outcome": outcome}) + "\n").encode())
    finally:
        os.close(fd)


def trace_peak_mib(job_dir: Path) -> float | None:
    """The highest ``gpu_mem_mb`` in the job's trace.csv (None: no trace, or no GPU figure)."""
    path = JobPaths.of(job_dir).trace
    if not path.exists():
        return None
    values = [s.gpu_mem_mb for s in read_trace(path) if s.gpu_mem_mb is not None]
    return max(values) if values else None


def at_a_time(intervals: Iterable[tuple[float, float]], after: float = float("-inf")) -> int:
    """The most intervals (start, end) open at one moment at or after ``after``; an interval
    that ends as another starts does not overlap it."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        if end <= after:
            continue
        events += [(max(start, after), 1), (end, -1)]
    most = count = 0
    for _, step in sorted(events):  # at a tie the end (-1) comes first
        count += step
        most = max(most, count)
    return most


def packed_rate(
    buckets: Iterable[Mapping[str, int]], bucket_s: float, window_s: float
) -> float | None:
    """The jobs' best aggregate samples/s over ``window_s`` of wall clock (over all of it where
    they trained for less): each job's samples per bucket of ``bucket_s`` ({bucket index:
    samples}, one clock for all) added up, then the best run of consecutive buckets. None where
    no job trained."""
    total: Counter[int] = Counter()
    for job in buckets:
        for index, samples in job.items():
            total[int(index)] += int(samples)
    if not total:
        return None
    first, last = min(total), max(total)
    width = min(max(1, round(window_s / bucket_s)), last - first + 1)
    window = best = sum(total[i] for i in range(first, first + width))
    for start in range(first + 1, last - width + 2):
        window += total[start + width - 1] - total[start - 1]
        best = max(best, window)
    return best / (width * bucket_s)


def rates_by_jobs(buckets: Iterable[Mapping[str, int]], bucket_s: float) -> dict[int, list[float]]:
    """The jobs' aggregate samples/s in each bucket (as ``packed_rate`` reads them), grouped
    by how many jobs trained through that bucket: a job trains from its first bucket to its
    last, and a bucket where any job began or ended (a part of a bucket) is left out."""
    total: Counter[int] = Counter()
    through: Counter[int] = Counter()
    edges: set[int] = set()
    for job in buckets:
        indices = [int(index) for index in job]
        if not indices:
            continue
        first, last = min(indices), max(indices)
        edges |= {first, last}
        through.update(range(first + 1, last))
        for key, samples in job.items():
            total[int(key)] += int(samples)
    rates: dict[int, list[float]] = {}
    for bucket, jobs in sorted(through.items()):
        if bucket not in edges:
            rates.setdefault(jobs, []).append(total[bucket] / bucket_s)
    return rates


def max_over_gpus(packing: Mapping[str, Mapping[str, Any]], key: str) -> float | None:
    """The largest ``key`` over the GPUs of ``gpu_packing.json`` (None: no GPU has it)."""
    values = [float(figures[key]) for figures in packing.values() if figures.get(key) is not None]
    return max(values) if values else None


def _number(text: str | None) -> float | None:
    return float(text) if text else None
