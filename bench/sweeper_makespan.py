"""Makespan of a sweep of uneven jobs through the Hydra CLI: furcate's sweeper against Hydra's.

The jobs of ``bench/makespan.py`` (48 sleeps of 0.5-3 s, ``random.Random(0)``) on 4 slots
(``hydra.launcher.gpus=[0,1,2,3]``: the jobs only see CUDA_VISIBLE_DEVICES, no GPU is needed),
nothing preloaded, no MLflow recording. Each run is a real ``python bench/apps/sleep_app.py -m``
in a subprocess, so a sweeper's own costs count; job ``i`` of the sweep ``i=range(0,48)`` sleeps
``durations[i]``, in that order. Every variant uses the furcate launcher:

  furcate       ``hydra/sweeper=furcate`` (default options, watch on): one job per free slot
                through submit_batch/wait_any, the next job the moment a slot frees;
  batches of 4  Hydra's BasicSweeper with ``max_batch_size=4``: a ``launch`` per 4 jobs, each
                waiting for its slowest job;
  one batch     BasicSweeper, max_batch_size unset: one ``launch`` of every job (the launcher
                streams inside it).

Makespan runs from the first job's task start to the last job's task end (``sleep.json`` in
each job's output dir); the command's wall time is reported as well. Lower bound:
max(total work / 4, longest job). Variants take turns within each round; figures are medians
over rounds. Run: ``python bench/sweeper_makespan.py`` (~5 min with 3 rounds).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.commands import app_command, run_command
from bench.harness import machine, publish
from bench.makespan import SLOTS, draw_durations
from bench.timeline import (
    Job,
    batch_gaps,
    batch_schedule,
    first_start,
    gap_figures,
    handoffs,
    job_from,
    last_end,
    list_schedule,
    lower_bound,
    on_last_slot,
    paired_ratio,
    print_work,
    read_timings,
    slot_gaps,
    span,
    task_seconds,
    work_figures,
)

APP = Path(__file__).resolve().parent / "apps" / "sleep_app.py"
COMMON_OVERRIDES = [
    f"hydra.launcher.gpus=[{','.join(str(i) for i in range(SLOTS))}]",
    "hydra.launcher.preload=[]",  # the jobs only sleep
    "hydra.launcher.mlflow.enabled=false",  # scheduling alone
]
VARIANTS: dict[str, list[str]] = {
    "furcate": ["hydra/sweeper=furcate"],
    "batches of 4": [f"hydra.sweeper.max_batch_size={SLOTS}"],
    "one batch": [],
}
BATCHED = "batches of 4"  # its batch boundaries are reported as well


@dataclass(frozen=True)
class Run:
    """One command: when it was started and returned, and its jobs."""

    variant: str
    began: float
    ended: float
    jobs: list[Job]

    @property
    def makespan(self) -> float:
        return span(self.jobs)


def run_sweep(variant: str, durations: Sequence[float], sweep_dir: Path) -> Run:
    """Run the sweep through the Hydra CLI; read each job's ``sleep.json``."""
    listed = ",".join(str(d) for d in durations)
    overrides = [
        f"i=range(0,{len(durations)})",
        f"durations=[{listed}]",
        f"hydra.sweep.dir={sweep_dir}",
        *COMMON_OVERRIDES,
        *VARIANTS[variant],
    ]
    done = run_command(app_command(APP, overrides), cwd=sweep_dir.parent).check(variant)
    timings = read_timings(sweep_dir, "sleep.json")
    for job_dir, info in timings.items():  # job numbers follow the sweep's order
        if int(job_dir.name) != info["i"]:
            raise RuntimeError(f"{variant}: job {job_dir.name} ran config i={info['i']}")
    jobs = [job_from(info) for info in timings.values()]
    if len(jobs) != len(durations):
        raise RuntimeError(f"{variant}: {len(jobs)} of {len(durations)} jobs wrote sleep.json")
    return Run(variant, done.began, done.ended, jobs)


def last_slot(run: Run) -> dict[str, float]:
    """Where the slot that finished last lost time: lead (after the first task started) and
    the gaps between its jobs are what the makespan pays beyond that slot's work."""
    on_slot = on_last_slot(run.jobs)
    return {
        "jobs": len(on_slot),
        "lead_s": round(on_slot[0].started_at - first_start(run.jobs), 3),
        "gaps_s": round(sum(slot_gaps(on_slot)), 3),
        "work_s": round(task_seconds(on_slot), 3),
    }


def summarize_run(run: Run, bound: float, model: float) -> dict[str, Any]:
    pairs = handoffs(run.jobs)
    gaps = slot_gaps(run.jobs)
    figures = {
        "makespan_s": round(run.makespan, 3),
        "over_lower_bound": round(run.makespan / bound, 4),
        "over_model": round(run.makespan / model, 4),
        "wall_s": round(run.ended - run.began, 3),
        "first_start_s": round(first_start(run.jobs) - run.began, 3),
        "exit_after_last_end_s": round(run.ended - last_end(run.jobs), 3),
        **gap_figures(gaps),
        "slots_used": len({j.slot for j in run.jobs}),
        "last_slot": last_slot(run),
        "gaps_s": [round(g, 4) for g in gaps],
        # a gap's two parts: previous task's end to the next job's process (exit, result back,
        # the sweeper's next submit, fork), then that process to its task (Hydra's run_job)
        "to_process_s": [round(b.entered_at - a.ended_at, 4) for a, b in pairs],
        "run_job_s": [round(b.started_at - b.entered_at, 4) for _, b in pairs],
    }
    if run.variant == BATCHED:
        figures["batch_gaps_s"] = [round(g, 4) for g in batch_gaps(run.jobs, SLOTS)]
    return figures


def summarize_variant(rounds: list[dict[str, Any]], model: float) -> dict[str, Any]:
    def median(key: str) -> float:
        return round(float(statistics.median(r[key] for r in rounds)), 4)

    def pooled(key: str) -> list[float]:
        return [x for r in rounds for x in r[key]]

    gaps = pooled("gaps_s")
    figures = {
        "makespan_s": median("makespan_s"),
        "over_lower_bound": median("over_lower_bound"),
        "zero_overhead_model_s": round(model, 3),
        "over_model": median("over_model"),
        "wall_s": median("wall_s"),
        "first_start_s": median("first_start_s"),
        "exit_after_last_end_s": median("exit_after_last_end_s"),
        **gap_figures(gaps),
        "gap_to_process_median_s": round(statistics.median(pooled("to_process_s")), 4),
        "gap_run_job_median_s": round(statistics.median(pooled("run_job_s")), 4),
        "rounds": [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rounds],
    }
    if "batch_gaps_s" in rounds[0]:
        figures["batch_gap_median_s"] = round(statistics.median(pooled("batch_gaps_s")), 4)
        figures["batch_gap_max_s"] = round(max(pooled("batch_gaps_s")), 4)
    return figures


def show(figures: dict[str, Any]) -> None:
    print_work(figures["work"], SLOTS, f"; medians of {figures['rounds']} rounds")
    print(
        f"{'variant':<14}{'makespan s':>11}{'÷ bound':>9}{'÷ model':>9}{'wall s':>9}"
        f"{'1st start s':>12}{'gap med s':>10}{'gap max s':>10}"
    )
    for name, row in figures["variants"].items():
        print(
            f"{name:<14}{row['makespan_s']:>11.2f}{row['over_lower_bound']:>9.3f}"
            f"{row['over_model']:>9.3f}{row['wall_s']:>9.2f}{row['first_start_s']:>12.2f}"
            f"{row['slot_gap_median_s']:>10.3f}{row['slot_gap_max_s']:>10.3f}"
        )
    print("gap = previous task's end to the next job's process + that process to its task:")
    for name, row in figures["variants"].items():
        print(
            f"  {name:<12} medians {row['gap_to_process_median_s']:.4f} + "
            f"{row['gap_run_job_median_s']:.4f} s"
        )
    batches = figures["variants"][BATCHED]
    print(
        f"{BATCHED}: last task end of a batch to first task start of the next: median "
        f"{batches['batch_gap_median_s']:.3f} s, max {batches['batch_gap_max_s']:.3f} s"
    )
    for name, ratio in figures["ratios"].items():
        print(f"{name}: median {ratio['median']:.3f} (rounds {ratio['per_round']})")
    print("slot that finished last, per round (s after the first task started):")
    for name, row in figures["variants"].items():
        for r in row["rounds"]:
            s = r["last_slot"]
            print(
                f"  {name:<12} lead {s['lead_s']:.3f}, gaps {s['gaps_s']:.3f} over "
                f"{s['jobs'] - 1} handoffs, work {s['work_s']:.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=48, help="number of sleep jobs")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant")
    args = parser.parse_args()
    if args.jobs <= SLOTS or args.rounds < 1:
        parser.error(f"--jobs must exceed {SLOTS} (two batches) and --rounds be at least 1")
    at_start = machine()
    durations = draw_durations(args.jobs)
    bound = lower_bound(durations, SLOTS)
    models = {
        "furcate": list_schedule(durations, SLOTS),
        "batches of 4": batch_schedule(durations, SLOTS),
        "one batch": list_schedule(durations, SLOTS),
    }
    names = list(VARIANTS)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # take turns first
                run = run_sweep(name, durations, Path(tmp) / f"{r}-{name.replace(' ', '-')}")
                rounds[name].append(summarize_run(run, bound, models[name]))
                print(f"round {r + 1} {name}: makespan {run.makespan:.2f} s", flush=True)
    figures = {
        "rounds": args.rounds,
        "overrides": {name: COMMON_OVERRIDES + extra for name, extra in VARIANTS.items()},
        "work": work_figures(durations, SLOTS, seed=0),
        "variants": {name: summarize_variant(rounds[name], models[name]) for name in names},
        "ratios": {
            f"{what} furcate / {other}": paired_ratio(rounds, "furcate", other, key)
            for other in ("batches of 4", "one batch")
            for what, key in (("makespan", "makespan_s"), ("wall", "wall_s"))
        },
    }
    publish("sweeper_makespan", at_start, figures, show)


if __name__ == "__main__":
    main()
