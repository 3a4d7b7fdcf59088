"""The jobs of a sweep on a timeline, as the makespan benchmarks read it: each job's slot and
times, the idle gaps on each slot, the zero-overhead schedules and lower bound a sweep is set
against, and the summary figures and lines those benchmarks share.

Times are wall-clock seconds (``time.time()``) taken by the jobs themselves.
"""

from __future__ import annotations

import heapq
import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Job",
    "batch_gaps",
    "batch_schedule",
    "first_start",
    "gap_figures",
    "handoffs",
    "job_from",
    "last_end",
    "list_schedule",
    "lower_bound",
    "on_last_slot",
    "paired_ratio",
    "print_work",
    "read_jobs",
    "read_timings",
    "slot_gaps",
    "span",
    "task_seconds",
    "work_figures",
]


@dataclass(frozen=True)
class Job:
    """One job as its task saw it."""

    num: int
    slot: str
    entered_at: float  # the job's process, after the fork (its task start where not known)
    started_at: float  # the task, after Hydra's run_job set-up
    ended_at: float


def read_timings(sweep_dir: Path, name: str, pattern: str = "*/{name}") -> dict[Path, Any]:
    """The timing file ``name`` that each job wrote into its output dir, by that dir."""
    return {
        path.parent: json.loads(path.read_text())
        for path in sweep_dir.glob(pattern.format(name=name))
    }


def job_from(info: Mapping[str, Any]) -> Job:
    """A job from its timing file: its number as ``num`` or ``i``, ``entered_at`` optional."""
    started = float(info["started_at"])
    return Job(
        int(info.get("num", info.get("i", -1))),
        str(info["slot"]),
        float(info.get("entered_at", started)),
        started,
        float(info["ended_at"]),
    )


def read_jobs(sweep_dir: Path, name: str, pattern: str = "*/{name}") -> list[Job]:
    """The jobs of a sweep, from the timing file ``name`` of each."""
    return [job_from(info) for info in read_timings(sweep_dir, name, pattern).values()]


def first_start(jobs: Sequence[Job]) -> float:
    return min(j.started_at for j in jobs)


def last_end(jobs: Sequence[Job]) -> float:
    return max(j.ended_at for j in jobs)


def span(jobs: Sequence[Job]) -> float:
    """First task start to last task end: the sweep's makespan as its tasks saw it."""
    return last_end(jobs) - first_start(jobs)


def task_seconds(jobs: Sequence[Job]) -> float:
    """The slots' busy time: the sum of the tasks' own times."""
    return sum(j.ended_at - j.started_at for j in jobs)


def handoffs(jobs: Sequence[Job]) -> list[tuple[Job, Job]]:
    """Consecutive jobs on each slot."""
    pairs: list[tuple[Job, Job]] = []
    for slot in {j.slot for j in jobs}:
        on_slot = sorted((j for j in jobs if j.slot == slot), key=lambda j: j.started_at)
        pairs += itertools.pairwise(on_slot)
    return pairs


def slot_gaps(jobs: Sequence[Job]) -> list[float]:
    """Idle time of each slot between one task's end and its next task's start."""
    return [b.started_at - a.ended_at for a, b in handoffs(jobs)]


def batch_gaps(jobs: Sequence[Job], size: int) -> list[float]:
    """Batches of ``size`` in job order: last task end of one to first task start of the next."""
    ordered = sorted(jobs, key=lambda j: j.num)
    batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    return [first_start(b) - last_end(a) for a, b in itertools.pairwise(batches)]


def on_last_slot(jobs: Sequence[Job]) -> list[Job]:
    """The jobs of the slot that finished last, in order: its idle time is what a makespan
    pays beyond that slot's work."""
    last = max(jobs, key=lambda j: j.ended_at)
    return sorted((j for j in jobs if j.slot == last.slot), key=lambda j: j.started_at)


def gap_figures(gaps: Sequence[float]) -> dict[str, float]:
    return {
        "slot_gap_median_s": round(statistics.median(gaps), 3),
        "slot_gap_max_s": round(max(gaps), 3),
    }


# -- what a sweep is set against ------------------------------------------------------------


def lower_bound(durations: Sequence[float], slots: int) -> float:
    """No schedule of these jobs on ``slots`` slots ends sooner."""
    return max(sum(durations) / slots, max(durations))


def list_schedule(durations: Sequence[float], slots: int) -> float:
    """Makespan of streaming with zero overhead: each job, in order, to the first free slot."""
    free_at = [0.0] * slots
    for duration in durations:
        heapq.heapreplace(free_at, free_at[0] + duration)
    return max(free_at)


def batch_schedule(durations: Sequence[float], slots: int) -> float:
    """Makespan of batches of ``slots`` with zero overhead: the sum of each batch's longest."""
    return sum(max(durations[i : i + slots]) for i in range(0, len(durations), slots))


def work_figures(durations: Sequence[float], slots: int, seed: int) -> dict[str, Any]:
    """The work of a sweep drawn with ``seed``: its jobs, their total and its lower bound."""
    return {
        "jobs": len(durations),
        "seed": seed,
        "total_s": round(sum(durations), 3),
        "longest_s": max(durations),
        "lower_bound_s": round(lower_bound(durations, slots), 3),
        "durations_s": list(durations),
    }


def print_work(work: Mapping[str, Any], slots: int, after: str) -> None:
    """The summary's first line: the work on the slots and its lower bound, then ``after``."""
    print(
        f"\n{work['jobs']} jobs, {work['total_s']:.2f} s of work on {slots} slots: lower bound "
        f"{work['lower_bound_s']:.2f} s{after}"
    )


def paired_ratio(
    rounds: Mapping[str, Sequence[Mapping[str, Any]]], a: str, b: str, key: str
) -> dict[str, Any]:
    """``key`` of ``a`` over ``b``, per round (the two ran in the same round) and the median."""
    pairs = zip(rounds[a], rounds[b], strict=True)
    per_round = [round(x[key] / y[key], 4) for x, y in pairs]
    return {"per_round": per_round, "median": round(statistics.median(per_round), 4)}
