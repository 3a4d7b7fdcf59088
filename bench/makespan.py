"""Makespan of a sweep of uneven jobs on 4 slots: the async path against Hydra's batches.

48 sleep jobs, 0.5-3 s each (``random.Random(0)``), on 4 slots (``hydra.launcher.gpus=[0,1,2,3]``;
the jobs only see CUDA_VISIBLE_DEVICES, so no GPU is needed), nothing preloaded, no MLflow
recording (``hydra.launcher.mlflow.enabled=false``: the launcher alone, as before recording
existed; ``bench/recording.py`` measures what recording adds). One launcher, hence one warm fork
server, runs every variant; its start is not part of any makespan.

  async         submit all jobs, collect with wait_any: a slot gets its next job as soon as
                it frees (furcate's sweepers);
  async window  the same calls with at most 2 x 4 jobs outstanding: each result is answered
                by the next submit, so configs are composed while the slots are busy instead
                of all up front (no job exit is handled while the caller is inside submit);
  batches       ``launch`` on consecutive batches of 4, as BasicSweeper with max_batch_size=4
                does: every batch waits for its slowest job;
  one launch    a single ``launch`` of all jobs (the pool queues them: async as well).

Makespan runs from the first launcher call to the last result. The lower bound is
max(total work / 4, longest job). Run: ``python bench/makespan.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from omegaconf import DictConfig

from bench.harness import (
    as_furcate,
    local_pool,
    machine,
    make_launcher,
    task_value,
    write_results,
)
from bench.timeline import (
    Job,
    batch_schedule,
    gap_figures,
    list_schedule,
    lower_bound,
    on_last_slot,
    print_work,
    slot_gaps,
    task_seconds,
    work_figures,
)
from furcate_hydra.launching.streaming import JobRequest
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

SLOTS = 4
GOAL_RATIO = 1.05
LAUNCHER_OVERRIDES = [
    "hydra/launcher=furcate",
    f"hydra.launcher.gpus=[{','.join(str(i) for i in range(SLOTS))}]",
    "hydra.launcher.preload=[]",  # the jobs only sleep
    "hydra.launcher.mlflow.enabled=false",  # the launcher alone; bench/recording.py times it
]


@dataclass(frozen=True)
class Run:
    """One variant: makespan and the jobs it ran."""

    name: str
    began: float
    ended: float
    jobs: list[Job]
    # when the last submit/launch call handing over jobs returned (async variants)
    all_submitted: float | None = None

    @property
    def makespan(self) -> float:
        return self.ended - self.began


def sleep_task(cfg: DictConfig) -> dict[str, Any]:
    """The benchmark's job: sleep for ``duration`` seconds, say on which slot and when."""
    entered = time.time()
    time.sleep(float(cfg.duration))
    return {"slot": os.environ["FURCATE_SLOT"], "started_at": entered, "ended_at": time.time()}


def draw_durations(count: int) -> list[float]:
    # Rounded so that the override, the lower bound and the model all use the same numbers.
    rng = random.Random(0)
    return [round(rng.uniform(0.5, 3.0), 3) for _ in range(count)]


def overrides_for(durations: Sequence[float]) -> list[list[str]]:
    return [[f"+duration={d}"] for d in durations]


def _record(job_return: JobReturn, num: int) -> Job:
    value = task_value(job_return)
    # the task's start stands for its process's entry, which this task does not read
    return Job(num, value["slot"], value["started_at"], value["started_at"], value["ended_at"])


def run_async(launcher: FurcateLauncher, durations: Sequence[float], first_num: int) -> Run:
    return _run_submitting(launcher, durations, first_num, window=len(durations), name="async")


def run_async_window(launcher: FurcateLauncher, durations: Sequence[float], first_num: int) -> Run:
    # One queued job per slot beyond the running ones, so a freed slot never waits for a submit.
    return _run_submitting(launcher, durations, first_num, window=2 * SLOTS, name="async window")


def _run_submitting(
    launcher: FurcateLauncher, durations: Sequence[float], first_num: int, window: int, name: str
) -> Run:
    """Submit in order with at most ``window`` jobs outstanding; collect with wait_any."""
    todo = list(enumerate(overrides_for(durations)))
    todo.reverse()  # popped from the end, in order
    began = time.time()
    all_submitted: float | None = None
    outstanding: dict[str, int] = {}
    jobs: list[Job] = []
    while todo or outstanding:
        while todo and len(outstanding) < window:
            i, overrides = todo.pop()
            (key,) = launcher.submit_batch([JobRequest(overrides, first_num + i)])
            outstanding[key] = first_num + i
            if not todo:
                all_submitted = time.time()
        jobs += [_record(ret, outstanding.pop(key)) for key, ret in launcher.wait_any()]
    return Run(name, began, time.time(), jobs, all_submitted)


def run_batches(launcher: FurcateLauncher, durations: Sequence[float], first_num: int) -> Run:
    began = time.time()
    jobs: list[Job] = []
    for start in range(0, len(durations), SLOTS):
        batch = durations[start : start + SLOTS]
        returns = launcher.launch(overrides_for(batch), first_num + start)
        jobs += [_record(ret, first_num + start + k) for k, ret in enumerate(returns)]
    return Run("batches", began, time.time(), jobs)


def run_one_launch(launcher: FurcateLauncher, durations: Sequence[float], first_num: int) -> Run:
    began = time.time()
    returns = launcher.launch(overrides_for(durations), first_num)
    jobs = [_record(ret, first_num + k) for k, ret in enumerate(returns)]
    return Run("one launch", began, time.time(), jobs)


def last_slot_idle(run: Run) -> dict[str, float]:
    """Where the slot that finished last lost time: that idle time is what the makespan pays.

    lead: first call to its first task entry; gaps: between its jobs (the job process's exit,
    the result's trip back, dispatch, fork and Hydra's run_job set-up of the next job; in the
    batch variant also the wait for the batch's slowest); tail: its last task's return to the
    result being back with the caller.
    """
    on_slot = on_last_slot(run.jobs)
    return {
        "jobs": len(on_slot),
        "lead_s": round(on_slot[0].started_at - run.began, 3),
        "gaps_s": round(sum(slot_gaps(on_slot)), 3),
        "tail_s": round(run.ended - on_slot[-1].ended_at, 3),
    }


def summarize_run(run: Run, durations: Sequence[float], model: float) -> dict[str, Any]:
    bound = lower_bound(durations, SLOTS)
    first_entry = min(job.started_at for job in run.jobs) - run.began
    return {
        "makespan_s": round(run.makespan, 3),
        "over_lower_bound": round(run.makespan / bound, 4),
        "zero_overhead_model_s": round(model, 3),
        "over_model": round(run.makespan / model, 4),
        "slot_busy_fraction": round(task_seconds(run.jobs) / (SLOTS * run.makespan), 4),
        "first_task_entry_s": round(first_entry, 3),
        **gap_figures(slot_gaps(run.jobs)),
        "slots_used": sorted({int(job.slot) for job in run.jobs}),
        "last_slot_idle": last_slot_idle(run),
        "all_submitted_s": None
        if run.all_submitted is None
        else round(run.all_submitted - run.began, 3),
    }


def print_table(results: dict[str, Any]) -> None:
    start = results["fork_server_start_s"]
    print_work(results["work"], SLOTS, f" (fork server start {start:.2f} s, not counted)")
    header = f"{'variant':<14}{'makespan s':>12}{'÷ bound':>10}{'model s':>10}{'÷ model':>10}"
    print(header + f"{'gap med s':>11}{'gap max s':>11}")
    for name, row in results["variants"].items():
        print(
            f"{name:<14}{row['makespan_s']:>12.2f}{row['over_lower_bound']:>10.3f}"
            f"{row['zero_overhead_model_s']:>10.2f}{row['over_model']:>10.3f}"
            f"{row['slot_gap_median_s']:>11.3f}{row['slot_gap_max_s']:>11.3f}"
        )
    print("idle time of the slot that finished last (s):")
    for name, row in results["variants"].items():
        idle = row["last_slot_idle"]
        print(
            f"  {name:<12} lead {idle['lead_s']:.3f}, gaps {idle['gaps_s']:.3f} "
            f"over {idle['jobs'] - 1} handoffs, tail {idle['tail_s']:.3f}"
        )
    ratio = results["variants"]["async"]["over_lower_bound"]
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"goal: async makespan <= {GOAL_RATIO} x lower bound: {verdict} ({ratio:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=48, help="number of sleep jobs")
    parser.add_argument("--no-one-launch", action="store_true", help="skip the optional variant")
    args = parser.parse_args()
    durations = draw_durations(args.jobs)
    variants: list[tuple[Callable[[FurcateLauncher, Sequence[float], int], Run], float]] = [
        (run_async, list_schedule(durations, SLOTS)),
        (run_async_window, list_schedule(durations, SLOTS)),
        (run_batches, batch_schedule(durations, SLOTS)),
    ]
    if not args.no_one_launch:
        variants.append((run_one_launch, list_schedule(durations, SLOTS)))
    results: dict[str, Any] = {
        "machine": machine(),
        "goal_async_over_lower_bound": GOAL_RATIO,
        "work": work_figures(durations, SLOTS, seed=0),
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        launcher = as_furcate(make_launcher(sleep_task, LAUNCHER_OVERRIDES, Path(tmp)))
        try:
            results["plan"] = launcher.session().executor.describe()
            results["fork_server_start_s"] = round(local_pool(launcher.session()).server_start_s, 3)
            for i, (variant, model) in enumerate(variants):
                run = variant(launcher, durations, 1000 * i)
                print(f"{run.name}: makespan {run.makespan:.2f} s")
                results["variants"][run.name] = summarize_run(run, durations, model)
        finally:
            launcher.close()
    results["goal_met"] = results["variants"]["async"]["over_lower_bound"] <= GOAL_RATIO
    path = write_results("makespan", results)
    print_table(results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
