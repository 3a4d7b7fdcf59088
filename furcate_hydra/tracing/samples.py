"""One sample of a job's resources, the peaks over its samples, and ``trace.csv``, their file.

    time,elapsed_s,rss_mb,cpu_percent,gpu_mem_mb,gpu_util_percent
    1764000000.512,10.001,812.4,98.7,,            (a CPU slot: no GPU figures)

The tracer appends one line per sample while the job runs, so a job that is killed keeps its
trace up to its death. A line is written with one ``write`` to a file opened for appending,
which a reader sees whole; rewriting the file atomically at every sample would cost time in
proportion to the trace's length.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["METRIC_PREFIX", "TracePeaks", "TraceSample", "append_sample", "read_trace"]

# A sample's figures go into the job's MLflow run as ``job/<field>`` metrics.
METRIC_PREFIX = "job/"
_FIGURES = ("rss_mb", "cpu_percent", "gpu_mem_mb", "gpu_util_percent")
COLUMNS = ("time", "elapsed_s", *_FIGURES)


@dataclass(frozen=True)
class TraceSample:
    """A job's process tree at one moment.

    Attributes:
        time: When (seconds since the epoch).
        elapsed_s: Seconds since the job's first process started.
        rss_mb: Resident memory of its processes, MiB.
        cpu_percent: CPU they used since the last sample; 100 is one core.
        gpu_mem_mb: GPU memory they hold (MiB); None on a CPU slot.
        gpu_util_percent: Their GPU's utilisation (all of its jobs); None on a CPU slot.
    """

    time: float
    elapsed_s: float
    rss_mb: float
    cpu_percent: float
    gpu_mem_mb: float | None = None
    gpu_util_percent: float | None = None

    def metrics(self) -> dict[str, float]:
        """The figures as MLflow metrics (``job/rss_mb``, ...), those there are."""
        return {
            METRIC_PREFIX + name: value
            for name in _FIGURES
            if (value := getattr(self, name)) is not None
        }


@dataclass(frozen=True)
class TracePeaks:
    """The highest value of each figure over a job's samples (None: never measured)."""

    samples: int = 0
    rss_mb: float | None = None
    cpu_percent: float | None = None
    gpu_mem_mb: float | None = None
    gpu_util_percent: float | None = None

    def add(self, sample: TraceSample) -> TracePeaks:
        peaks = {
            f.name: _max(getattr(self, f.name), getattr(sample, f.name))
            for f in fields(self)
            if f.name != "samples"
        }
        return TracePeaks(samples=self.samples + 1, **peaks)


def append_sample(path: Path, sample: TraceSample, new: bool) -> None:
    """Append ``sample`` to the trace at ``path``; ``new`` starts the file over, with its
    header (a job dir reused by a later sweep keeps no old trace)."""
    line = ",".join(_cell(getattr(sample, name)) for name in COLUMNS) + "\n"
    if new:
        line = ",".join(COLUMNS) + "\n" + line
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if new else os.O_APPEND)
    fd = os.open(path, flags, 0o666)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_trace(path: Path) -> list[TraceSample]:
    """The samples in a trace file (a last line cut short is left out)."""
    samples: list[TraceSample] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                samples.append(
                    TraceSample(
                        float(row["time"]),
                        float(row["elapsed_s"]),
                        float(row["rss_mb"]),
                        float(row["cpu_percent"]),
                        _optional(row.get("gpu_mem_mb")),
                        _optional(row.get("gpu_util_percent")),
                    )
                )
            except (TypeError, ValueError):
                continue
    return samples


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def _optional(text: str | None) -> float | None:
    return float(text) if text else None


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
