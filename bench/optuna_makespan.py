"""Makespan of an Optuna study through the Hydra CLI: furcate_optuna's asynchronous loop against
the batch-synchronous loop of hydra-optuna-sweeper.

32 trials on 4 slots (``hydra.launcher.gpus=[0,1,2,3]``: the jobs only see CUDA_VISIBLE_DEVICES,
no GPU is needed), nothing preloaded, every job recorded in MLflow (a fresh sqlite store per
run), a fresh Optuna storage per run. Each run is a real ``python bench/apps/optuna_sleep_app.py
-m`` in a subprocess, so the sweeper's own costs count. A trial samples ``d`` from
``choice(1.5,3.0,6.0,9.0)`` (its job sleeps ``d`` seconds) and ``x`` from ``interval(0,1)`` (the
value to minimise, ``(x - 0.3) ** 2``; it also makes every trial's config unique, so that the
launcher's record never skips a repeated config). Both modes use ``hydra/sweeper=furcate_optuna``
and the furcate launcher:

  async  ``hydra.sweeper.asynchronous=true`` (the default): a slot gets a new trial the moment
         its trial ends;
  batch  ``hydra.sweeper.asynchronous=false hydra.sweeper.n_jobs=4``: ask 4 trials, launch
         them, wait for all 4, tell them, repeat (hydra-optuna-sweeper's loop).

Samplers: ``random`` (RandomSampler, fixed seed) is the main row: both modes ask the same
sequence of trials, so the work is identical; the script checks that on the studies' trials, and
that it is the sequence an in-memory study with the same sampler asks. Since the draw decides how
much batching can lose, each round draws with its own seed (``--seed`` + round), shared by both
modes, and each draw's zero-overhead sweep ratio is set against seeds 0-199.
``tpe`` (TPESampler, same seed, constant_liar on by default) is a second row: after its 10
random startup trials what it asks depends on what was told before, hence on timing in async
mode, so each run's own work and lower bound are reported.

Per run: the command's wall time; the sweep time from the first trial's task start to the last
one's task end (``trial.json`` in each job's output dir); the lower bound max(work / 4, longest
trial) of that run's trials; and the idle fraction of the slots, 1 - (sum of task times) /
(4 x sweep time). Async / batch ratios pair the two runs of each round; the goal is a wall-time
ratio of at most 0.75. The modes take turns going first. Run: ``python bench/optuna_makespan.py``
(~8 min with 3 rounds of the random sampler; `--samplers random,tpe` adds the TPE row).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.commands import app_command, run_command
from bench.harness import machine, publish
from bench.makespan import SLOTS
from bench.quiet import quiet_optuna
from bench.timeline import (
    Job,
    batch_gaps,
    batch_schedule,
    first_start,
    gap_figures,
    job_from,
    last_end,
    list_schedule,
    lower_bound,
    paired_ratio,
    read_timings,
    slot_gaps,
    span,
    task_seconds,
)

APP = Path(__file__).resolve().parent / "apps" / "optuna_sleep_app.py"
# Trials of seconds, not of the minutes real training takes, yet long enough that the ~8 s a
# command spends starting and writing results (the same in both modes) do not hide the loops.
DURATIONS = (1.5, 3.0, 6.0, 9.0)
STUDY = "bench"
GOAL_RATIO = 0.75
COMMON_OVERRIDES = [
    f"d=choice({','.join(str(d) for d in DURATIONS)})",
    "x=interval(0.0,1.0)",
    f"hydra.launcher.gpus=[{','.join(str(i) for i in range(SLOTS))}]",
    "hydra.launcher.preload=[]",  # the jobs only sleep
    f"hydra.sweeper.study_name={STUDY}",
]
MODES: dict[str, list[str]] = {
    "async": ["hydra.sweeper.asynchronous=true"],
    "batch": ["hydra.sweeper.asynchronous=false", f"hydra.sweeper.n_jobs={SLOTS}"],
}
SAMPLERS = ("random", "tpe")
DEFAULT_SAMPLERS = ("random",)


def sampler_overrides(sampler: str, seed: int) -> list[str]:
    return [f"hydra/sweeper/sampler={sampler}", f"hydra.sweeper.sampler.seed={seed}"]


@dataclass(frozen=True)
class Trial:
    """One trial as the study recorded it."""

    number: int
    state: str
    d: float
    x: float


@dataclass(frozen=True)
class Run:
    """One command: when it was started and returned, its jobs and its study's trials."""

    mode: str
    began: float
    ended: float
    jobs: list[Job]
    durations: dict[int, float]  # job num -> seconds slept
    trials: list[Trial]
    mlflow_runs: dict[str, int]  # status -> runs in the store
    others_cpu_share: float  # of the machine's CPU, used by other processes meanwhile

    @property
    def sweep_s(self) -> float:
        return span(self.jobs)

    @property
    def work(self) -> list[float]:
        """Seconds each trial slept, in trial order."""
        return [t.d for t in self.trials]


def read_trials(storage: str) -> list[Trial]:
    import optuna

    quiet_optuna()
    study = optuna.load_study(study_name=STUDY, storage=storage)
    return [
        Trial(t.number, t.state.name, float(t.params["d"]), float(t.params["x"]))
        for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    ]


def read_mlflow_runs(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
    return {str(status): int(count) for status, count in rows}


def run_study(mode: str, extra: Sequence[str], trials: int, run_dir: Path) -> Run:
    """Run the study through the Hydra CLI; read each job's ``trial.json`` and the study."""
    run_dir.mkdir(parents=True)
    sweep_dir = run_dir / "sweep"
    storage = f"sqlite:///{run_dir / 'optuna.db'}"
    overrides = [
        *COMMON_OVERRIDES,
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.storage={storage}",
        f"hydra.launcher.mlflow.tracking_uri=sqlite:///{run_dir / 'mlflow.db'}",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
        *MODES[mode],
    ]
    done = run_command(app_command(APP, overrides), cwd=run_dir).check(mode)
    timings = read_timings(sweep_dir, "trial.json").values()
    jobs = [job_from(info) for info in timings]
    durations = {info["num"]: info["duration"] for info in timings}
    study = read_trials(storage)
    if len(jobs) != trials or len(study) != trials:
        raise RuntimeError(f"{mode}: {len(jobs)} jobs wrote trial.json, {len(study)} trials")
    if not all(t.state == "COMPLETE" for t in study):
        raise RuntimeError(f"{mode}: trials not all COMPLETE: {[t.state for t in study]}")
    # no exclusions: job num and trial number both count the asks
    if any(durations[t.number] != t.d for t in study):
        raise RuntimeError(f"{mode}: a job slept another duration than its trial's d")
    mlflow_runs = read_mlflow_runs(run_dir / "mlflow.db")
    return Run(
        mode, done.began, done.ended, jobs, durations, study, mlflow_runs, done.others_cpu_share
    )


def random_sequence(seed: int, trials: int) -> list[float]:
    """The ``d`` the seeded RandomSampler asks, in trial order, from an in-memory study asking
    as the sweeper does (one ``ask`` per trial with the search space as fixed distributions)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    quiet_optuna()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    space = {"d": CategoricalDistribution(DURATIONS), "x": FloatDistribution(0.0, 1.0)}
    sequence = []
    for _ in range(trials):
        trial = study.ask(fixed_distributions=space)
        sequence.append(float(trial.params["d"]))
        study.tell(trial, 0.0)
    return sequence


def seed_context(
    used: Sequence[int], trials: int, measured: Sequence[list[float]], seeds: int = 200
) -> dict[str, Any]:
    """How the rounds' draws compare with others: the zero-overhead sweep ratio async / batch
    (list scheduling in trial order over the sum of each batch's longest trial) of each seed
    used, against seeds 0 to ``seeds`` - 1."""

    def model_ratio(sequence: list[float]) -> float:
        return list_schedule(sequence, SLOTS) / batch_schedule(sequence, SLOTS)

    ratios = [model_ratio(random_sequence(s, trials)) for s in range(seeds)]
    ours = [model_ratio(m) for m in measured]
    deciles = statistics.quantiles(ratios, n=10)
    return {
        "measured_sequence_is_the_samplers": all(
            random_sequence(seed, trials) == m for seed, m in zip(used, measured, strict=True)
        ),
        "model_ratio_by_round": [round(r, 4) for r in ours],
        "model_ratio": round(statistics.median(ours), 4),
        "seeds": seeds,
        "model_ratio_median": round(statistics.median(ratios), 4),
        "model_ratio_p10_p90": [round(deciles[0], 4), round(deciles[-1], 4)],
        "share_of_seeds_at_or_below": round(
            sum(r <= statistics.median(ours) for r in ratios) / seeds, 3
        ),
        "work_s_median": statistics.median(sum(random_sequence(s, trials)) for s in range(seeds)),
    }


def summarize_run(run: Run) -> dict[str, Any]:
    bound = lower_bound(run.work, SLOTS)
    schedule = list_schedule if run.mode == "async" else batch_schedule
    model = schedule(run.work, SLOTS)
    busy = task_seconds(run.jobs)
    figures: dict[str, Any] = {
        "wall_s": round(run.ended - run.began, 3),
        "sweep_s": round(run.sweep_s, 3),
        "work_s": round(sum(run.work), 3),
        "longest_s": max(run.work),
        "lower_bound_s": round(bound, 3),
        "sweep_over_lower_bound": round(run.sweep_s / bound, 4),
        "zero_overhead_model_s": round(model, 3),
        "sweep_over_model": round(run.sweep_s / model, 4),
        "busy_s": round(busy, 3),
        "idle_fraction": round(1 - busy / (SLOTS * run.sweep_s), 4),
        # the command's wall time as slot time: start-up and the end count as idle
        "idle_fraction_of_wall": round(1 - busy / (SLOTS * (run.ended - run.began)), 4),
        "first_start_s": round(first_start(run.jobs) - run.began, 3),
        "exit_after_last_end_s": round(run.ended - last_end(run.jobs), 3),
        **gap_figures(slot_gaps(run.jobs)),
        "slots_used": len({j.slot for j in run.jobs}),
        "mlflow_runs": run.mlflow_runs,
        "others_cpu_share": run.others_cpu_share,
        "durations_by_trial": run.work,
    }
    if run.mode == "batch":
        between = batch_gaps(run.jobs, SLOTS)
        figures["batch_gap_median_s"] = round(statistics.median(between), 3)
        figures["batch_gap_max_s"] = round(max(between), 3)
    return figures


MEDIAN_KEYS = (
    "wall_s",
    "sweep_s",
    "work_s",
    "lower_bound_s",
    "sweep_over_lower_bound",
    "sweep_over_model",
    "idle_fraction",
    "idle_fraction_of_wall",
    "first_start_s",
    "exit_after_last_end_s",
    "slot_gap_median_s",
    "others_cpu_share",
)


def summarize_mode(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        key: round(float(statistics.median(r[key] for r in rounds)), 4) for key in MEDIAN_KEYS
    }
    figures["slot_gap_max_s"] = max(r["slot_gap_max_s"] for r in rounds)
    if "batch_gap_median_s" in rounds[0]:
        figures["batch_gap_median_s"] = statistics.median(r["batch_gap_median_s"] for r in rounds)
        figures["batch_gap_max_s"] = max(r["batch_gap_max_s"] for r in rounds)
    figures["rounds"] = [{k: v for k, v in r.items() if k != "durations_by_trial"} for r in rounds]
    return figures


def workload(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Whether both modes of each round (one seed) ran the same trials (d in trial order, and
    as multisets)."""
    pairs = list(zip(*(runs for runs in rounds.values()), strict=True))
    same = [
        all(r["durations_by_trial"] == pair[0]["durations_by_trial"] for r in pair)
        for pair in pairs
    ]
    multiset = [
        all(sorted(r["durations_by_trial"]) == sorted(pair[0]["durations_by_trial"]) for r in pair)
        for pair in pairs
    ]
    return {
        "same_sequence_in_every_round": all(same),
        "same_multiset_in_every_round": all(multiset),
        "durations_by_trial": {
            mode: [r["durations_by_trial"] for r in runs] for mode, runs in rounds.items()
        },
        "count_by_duration": {
            mode: [{str(d): r["durations_by_trial"].count(d) for d in DURATIONS} for r in runs]
            for mode, runs in rounds.items()
        },
    }


def show(figures: dict[str, Any]) -> None:
    print(
        f"\n{figures['trials']} trials on {SLOTS} slots, d from {list(DURATIONS)}, seeds "
        f"{figures['seeds']} (one per round); medians of {figures['rounds']} rounds"
    )
    print(
        f"{'sampler':<8}{'mode':<7}{'wall s':>8}{'sweep s':>9}{'work s':>8}{'bound s':>9}"
        f"{'÷ bound':>9}{'÷ model':>9}{'idle':>7}{'1st start s':>12}{'exit s':>8}{'others':>8}"
    )
    for sampler, row in figures["samplers"].items():
        for mode, m in row["modes"].items():
            print(
                f"{sampler:<8}{mode:<7}{m['wall_s']:>8.2f}{m['sweep_s']:>9.2f}{m['work_s']:>8.2f}"
                f"{m['lower_bound_s']:>9.2f}{m['sweep_over_lower_bound']:>9.3f}"
                f"{m['sweep_over_model']:>9.3f}{m['idle_fraction']:>7.1%}"
                f"{m['first_start_s']:>12.2f}{m['exit_after_last_end_s']:>8.2f}"
                f"{m['others_cpu_share']:>8.1%}"
            )
    for sampler, row in figures["samplers"].items():
        same = row["workload"]
        print(
            f"{sampler}: same trials (d in trial order) in both modes of every round: "
            f"{same['same_sequence_in_every_round']}, same multiset: "
            f"{same['same_multiset_in_every_round']}"
        )
        for name, ratio in row["ratios"].items():
            print(f"  {name}: median {ratio['median']:.3f} (rounds {ratio['per_round']})")
        batch = row["modes"]["batch"]
        print(
            f"  batch: last task end of a batch to first task start of the next: median "
            f"{batch['batch_gap_median_s']:.3f} s, max {batch['batch_gap_max_s']:.3f} s; "
            f"async slot gap median {row['modes']['async']['slot_gap_median_s']:.3f} s"
        )
    if "random" in figures["samplers"]:
        c = figures["samplers"]["random"]["workload"]["seed_context"]
        print(
            f"random, seeds {figures['seeds']}: the sampler's own sequences: "
            f"{c['measured_sequence_is_the_samplers']}; zero-overhead sweep ratios "
            f"{c['model_ratio_by_round']}, median {c['model_ratio']:.3f} at or above "
            f"{c['share_of_seeds_at_or_below']:.0%} of seeds "
            f"0-{c['seeds'] - 1} (median {c['model_ratio_median']:.3f}, p10-p90 "
            f"{c['model_ratio_p10_p90'][0]:.3f}-{c['model_ratio_p10_p90'][1]:.3f})"
        )
    goal = figures["goal"]
    print(
        f"goal: wall async / batch ≤ {GOAL_RATIO} ({goal['sampler']}): median "
        f"{goal['median']:.3f}, {'met' if goal['met'] else 'not met'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode per sampler")
    parser.add_argument("--trials", type=int, default=32, help="hydra.sweeper.n_trials")
    parser.add_argument(
        "--seed", type=int, default=0, help="round r uses hydra.sweeper.sampler.seed=seed + r"
    )
    parser.add_argument(
        "--samplers",
        default=",".join(DEFAULT_SAMPLERS),
        help="comma-separated, of: random (the goal's row), tpe",
    )
    args = parser.parse_args()
    samplers = [s for s in args.samplers.split(",") if s]
    if (
        args.rounds < 1
        or args.trials <= SLOTS
        or not set(samplers) <= set(SAMPLERS)
        or not samplers
    ):
        parser.error(f"--rounds ≥ 1, --trials > {SLOTS}, --samplers from {', '.join(SAMPLERS)}")
    at_start = machine()
    modes = list(MODES)
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {m: [] for m in modes} for s in samplers
    }
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        for r in range(args.rounds):
            for sampler in samplers:
                # one draw per round, shared by both modes: a single seed's draw decides how
                # much batching loses, so several draws say more than one
                extra = sampler_overrides(sampler, args.seed + r)
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # take turns
                    run = run_study(mode, extra, args.trials, Path(tmp) / f"{r}-{sampler}-{mode}")
                    rounds[sampler][mode].append(summarize_run(run))
                    print(
                        f"round {r + 1} {sampler} {mode}: wall {run.ended - run.began:.2f} s, "
                        f"sweep {run.sweep_s:.2f} s, others' CPU {run.others_cpu_share:.0%}",
                        flush=True,
                    )
    results: dict[str, Any] = {}
    for sampler in samplers:
        by_mode = rounds[sampler]
        results[sampler] = {
            "overrides": {
                # round r's seed is args.seed + r
                mode: [*COMMON_OVERRIDES, *sampler_overrides(sampler, args.seed), *MODES[mode]]
                for mode in modes
            },
            "workload": workload(by_mode),
            "modes": {mode: summarize_mode(by_mode[mode]) for mode in modes},
            "ratios": {
                f"{what} async / batch": paired_ratio(by_mode, "async", "batch", key)
                for what, key in (
                    ("wall", "wall_s"),
                    ("sweep", "sweep_s"),
                    ("sweep ÷ bound", "sweep_over_lower_bound"),
                )
            },
        }
    if "random" in results:
        used = [args.seed + r for r in range(args.rounds)]
        measured = [r["durations_by_trial"] for r in rounds["random"]["async"]]
        results["random"]["workload"]["seed_context"] = seed_context(used, args.trials, measured)
    main_sampler = samplers[0]
    wall = results[main_sampler]["ratios"]["wall async / batch"]
    figures = {
        "rounds": args.rounds,
        "trials": args.trials,
        "seeds": [args.seed + r for r in range(args.rounds)],
        "durations": list(DURATIONS),
        "samplers": results,
        "goal": {
            "sampler": main_sampler,
            "wall_ratio_at_most": GOAL_RATIO,
            "median": wall["median"],
            "met": wall["median"] <= GOAL_RATIO,
            "every_round": all(x <= GOAL_RATIO for x in wall["per_round"]),
        },
    }
    publish("optuna_makespan", at_start, figures, show)


if __name__ == "__main__":
    main()
