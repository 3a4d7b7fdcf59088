"""Job start overhead: from handing a job to the launcher until the job's code is running.

Variants, each job handed over alone onto a free slot (the next one only after it ended):

  furcate submit  FurcateLauncher.submit + wait_any, the path furcate's sweepers take; the fork
                  server preloads torch and pytorch_lightning (the launcher's default also
                  preloads mlflow, which jobs that record nothing do not need);
  furcate launch  Launcher.launch of a one-job batch (what Hydra's BasicSweeper calls);
  plain spawn     a new interpreter that imports torch and pytorch_lightning: the anchor, what
                  a job costs to start without a warm server;
  basic launch    Hydra's basic launcher with a one-job batch: the job runs inside this process,
                  nothing is imported or forked, so this is Hydra's own floor.

The clock starts just before the launcher call and stops when the task function is entered, so
the furcate and basic figures include composing the job's config and Hydra's ``run_job`` set-up
(output dir, .hydra/*.yaml, job logging), not only the fork. The furcate launcher records
nothing (``hydra.launcher.mlflow.enabled=false``): this is the launcher alone, as before
recording existed; ``bench/recording.py`` measures what recording adds. Run:
``python bench/job_start.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bench.harness import (
    as_furcate,
    local_pool,
    machine,
    make_launcher,
    summarize,
    task_value,
    write_results,
)
from furcate_hydra.launching.streaming import JobRequest
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

GOAL_MEDIAN_MS = 50.0
SPAWN_CODE = "import torch, pytorch_lightning; import time; print(time.time())"
FURCATE_OVERRIDES = [
    "hydra/launcher=furcate",
    "hydra.launcher.preload=[torch,pytorch_lightning]",
    "hydra.launcher.mlflow.enabled=false",
]


@dataclass(frozen=True)
class Timing:
    """One job, in seconds after the launcher call began."""

    # the call handing the job over returned (submit only: launch returns with the result)
    handed_over: float | None
    # the job's process was entered, right after fork (furcate only)
    process: float | None
    # the task function was entered: what "job start" means here
    task: float
    # the job's result was back in this process
    returned: float


def entry_task(cfg: DictConfig) -> dict[str, float | None]:
    """The benchmark's job: note when it was entered, and when its process was."""
    entered = time.time()
    forked = os.environ.get("FURCATE_JOB_STARTED_AT")
    return {"entered_at": entered, "process_at": float(forked) if forked else None}


def _timing(began: float, value: dict[str, float | None], handed_over: float | None) -> Timing:
    returned = time.time()
    entered, process = value["entered_at"], value["process_at"]
    assert entered is not None
    return Timing(
        handed_over=None if handed_over is None else handed_over - began,
        process=None if process is None else process - began,
        task=entered - began,
        returned=returned - began,
    )


def time_submit(launcher: FurcateLauncher, job_num: int) -> Timing:
    """One job through submit/wait_any; the pool has every slot free when it is called."""
    began = time.time()
    (key,) = launcher.submit_batch([JobRequest([], job_num)])
    handed_over = time.time()
    while True:
        for done_key, job_return in launcher.wait_any():
            if done_key == key:
                return _timing(began, task_value(job_return), handed_over)


def time_launch(launch: Callable[[list[list[str]], int], Any], job_num: int) -> Timing:
    """One one-job batch through ``Launcher.launch``."""
    began = time.time()
    (job_return,) = launch([[]], job_num)
    return _timing(began, task_value(job_return), None)


def time_spawn() -> float:
    """Seconds from starting a cold interpreter until it has imported torch and Lightning."""
    began = time.time()
    done = subprocess.run(
        [sys.executable, "-c", SPAWN_CODE], capture_output=True, text=True, check=True
    )
    return float(done.stdout.split()[-1]) - began


def start_furcate(sweep_dir: Path) -> tuple[FurcateLauncher, dict[str, float]]:
    """The furcate launcher with its fork server started (torch, Lightning), and what it took."""
    launcher = as_furcate(make_launcher(entry_task, FURCATE_OVERRIDES, sweep_dir))
    began = time.perf_counter()
    session = launcher.session()
    return launcher, {
        "session_s": round(time.perf_counter() - began, 3),
        "server_start_s": round(local_pool(session).server_start_s, 3),
    }


def bench_furcate(jobs: int, sweep_dir: Path) -> dict[str, Any]:
    launcher, server = start_furcate(sweep_dir)
    plan = launcher.session().executor.describe()
    try:
        print(f"fork server ready in {server['server_start_s']:.2f} s; timing {jobs} jobs")
        # The first job after the server starts touches cold pages; it is kept apart.
        first = time_submit(launcher, 0)
        submits = [time_submit(launcher, 1 + i) for i in range(jobs)]
        launches = [time_launch(launcher.launch, 1000 + i) for i in range(jobs)]
    finally:
        launcher.close()
    return {
        "plan": plan,
        "fork_server": server,
        "first_job": asdict(first),
        "submit": _report(submits),
        "launch": _report(launches),
    }


def bench_basic(jobs: int, sweep_dir: Path) -> dict[str, Any]:
    launcher = make_launcher(entry_task, ["hydra/launcher=basic"], sweep_dir)
    first = time_launch(launcher.launch, 0)  # sets up logging and caches once: kept apart
    launches = [time_launch(launcher.launch, 1 + i) for i in range(jobs)]
    return {"first_job": asdict(first), "launch": _report(launches)}


def bench_spawn(jobs: int) -> dict[str, Any]:
    print(f"timing {jobs} plain spawns (a few seconds each)")
    return {"code": SPAWN_CODE, "to_imported": summarize([time_spawn() for _ in range(jobs)])}


def _report(timings: list[Timing]) -> dict[str, Any]:
    """Task entry statistics plus where the time went (medians of each step)."""
    report: dict[str, Any] = {"to_task": summarize([t.task for t in timings])}
    steps: dict[str, list[float | None]] = {
        "handed_over": [t.handed_over for t in timings],
        "to_process": [t.process for t in timings],
        "to_result": [t.returned for t in timings],
    }
    for name, values in steps.items():
        known = [v for v in values if v is not None]
        if known:
            report[name] = summarize(known)
    return report


def ratios(results: dict[str, Any]) -> dict[str, float]:
    furcate_submit = results["furcate"]["submit"]["to_task"]["median_ms"]
    furcate_launch = results["furcate"]["launch"]["to_task"]["median_ms"]
    spawn = results["spawn"]["to_imported"]["median_ms"]
    basic = results["basic"]["launch"]["to_task"]["median_ms"]
    return {
        "furcate_submit_over_spawn": round(furcate_submit / spawn, 4),
        "furcate_submit_over_basic": round(furcate_submit / basic, 2),
        "furcate_launch_over_spawn": round(furcate_launch / spawn, 4),
        "furcate_launch_over_basic": round(furcate_launch / basic, 2),
    }


def print_table(results: dict[str, Any]) -> None:
    spawn = results["spawn"]["to_imported"]["median_ms"]
    rows = [
        ("furcate submit", results["furcate"]["submit"]["to_task"]),
        ("furcate launch", results["furcate"]["launch"]["to_task"]),
        ("plain spawn", results["spawn"]["to_imported"]),
        ("basic launch", results["basic"]["launch"]["to_task"]),
    ]
    print(f"\n{'job start':<16}{'n':>4}{'median ms':>12}{'p90 ms':>10}{'÷ spawn':>10}")
    for name, stats in rows:
        share = stats["median_ms"] / spawn
        print(
            f"{name:<16}{stats['n']:>4}{stats['median_ms']:>12.1f}{stats['p90_ms']:>10.1f}"
            f"{share:>10.4f}"
        )
    submit = results["furcate"]["submit"]
    steps = ("handed_over", "to_process", "to_task", "to_result")
    print("\nfurcate submit, median ms after the call began:")
    print("  " + ", ".join(f"{step} {submit[step]['median_ms']:.1f}" for step in steps))
    server = results["furcate"]["fork_server"]
    print(f"fork server start (once per sweep): {server['server_start_s']:.2f} s")
    for name, value in results["ratios"].items():
        print(f"{name}: {value}")
    median = submit["to_task"]["median_ms"]
    verdict = "met" if median <= GOAL_MEDIAN_MS else "NOT met"
    print(f"goal: median furcate job start <= {GOAL_MEDIAN_MS:.0f} ms: {verdict} ({median:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=30, help="jobs per furcate/basic variant")
    parser.add_argument("--spawns", type=int, default=5, help="plain spawns (~4.5 s each)")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine(), "goal_median_ms": GOAL_MEDIAN_MS}
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        results["furcate"] = bench_furcate(args.jobs, Path(tmp) / "furcate")
        results["spawn"] = bench_spawn(args.spawns)
        # Last: the basic launcher runs jobs in this process and reconfigures its logging.
        results["basic"] = bench_basic(args.jobs, Path(tmp) / "basic")
    results["ratios"] = ratios(results)
    results["goal_met"] = results["furcate"]["submit"]["to_task"]["median_ms"] <= GOAL_MEDIAN_MS
    path = write_results("job_start", results)
    print_table(results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
