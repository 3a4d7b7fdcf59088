"""Read back what a probe-app sweep ran, from the job dirs it left."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


@dataclass(frozen=True)
class RanJob:
    num: int
    overrides: tuple[str, ...]
    probe: dict[str, Any]  # what the job process recorded: pid, slot, started_at, ended_at

    @property
    def started_at(self) -> float:
        return float(self.probe["started_at"])

    @property
    def ended_at(self) -> float:
        return float(self.probe["ended_at"])


def ran_jobs(sweep_dir: Path) -> dict[int, RanJob]:
    """Every job whose task function ran, by job number."""
    jobs = {}
    for probe in sweep_dir.glob("*/probe.json"):
        overrides = OmegaConf.load(probe.parent / ".hydra" / "overrides.yaml")
        info = json.loads(probe.read_text())
        num = int(info["num"])
        jobs[num] = RanJob(num, tuple(str(o) for o in overrides), info)
    return dict(sorted(jobs.items()))


def ran_overrides(sweep_dir: Path) -> list[tuple[str, ...]]:
    return [job.overrides for job in ran_jobs(sweep_dir).values()]


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most ``(start, end)`` intervals that overlap at one moment."""
    spans = list(intervals)
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:  # at equal times the end (-1) sorts first: touching is not overlap
        running += step
        peak = max(peak, running)
    return peak
