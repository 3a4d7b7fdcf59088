"""Start-up and handoff through the Hydra CLI, each figure beside its anchor in the same run.

Every command is a fresh ``python <app> -m ...`` in a subprocess, in its own directory with an
empty MLflow store (``mlflow.db``, schema made) as the launcher's default store, so everything
a user waits for counts. Two task modules (``bench/apps/startup_*_app.py``): ``light`` imports
nothing heavy, ``torch`` imports torch and pytorch_lightning as a Lightning app does. A job's
first line writes the time into ``times.json``, with its end and its slot.

  first job   ``-m i=0,1``: command start to the first job's first line, under Hydra's basic
              launcher (the anchor), the furcate launcher (defaults: every job recorded in
              MLflow) and the furcate launcher with ``mlflow.enabled=false``; also from the
              end of the task module's imports, which every launcher waits for alike;
  skipped     the furcate command run again in the same directory (new sweep dir), every
              config FINISHED: its wall time, beside the basic launcher's whole 2-job sweep;
  fresh       the torch task's first job in a new directory, no ``mlflow.db`` in it yet: the
              basic launcher (anchor); furcate copying the new store from the template an
              earlier sweep kept (``store_template``); furcate on a machine with no template
              yet (it makes one); furcate with the store made (as a rerun finds it);
  handoff     ``-m i=range(0,12) d=0.2`` on 2 slots: a slot's idle time from one job's last
              line to its next job's first line, furcate under Hydra's basic sweeper (one
              ``launch``) and under ``hydra/sweeper=furcate``; anchor: the gap between the
              basic launcher's consecutive jobs (in its own process, no new process);
  optuna      16 trials of ``hydra/sweeper=furcate_optuna`` (RandomSampler, seed = round) on 4
              slots, each sleeping d in {0.5, 1, 2, 3} s, and 16 jobs of those durations under
              ``hydra/sweeper=furcate``: first task start to last task end against a
              zero-overhead streaming schedule of the same jobs (each, in order, onto the
              first slot that frees), and the gaps between jobs on a slot;
  ddp         a DDP job (``strategy=ddp``, 2 ranks on CPU with gloo, ``bench/apps/
              ddp_bench_app.py``) under Hydra's basic launcher (the anchor) and furcate:
              its task entered (rank 0) to every rank training (each rank's
              ``on_train_start``), by the ranks' own clocks; furcate's over the anchor's.

Variants take turns within a round; figures are medians over rounds, with the share of the
machine's CPU that other processes used meanwhile. ``--before DIR`` also runs every furcate
variant with ``PYTHONPATH=DIR`` (a checkout of older code), in the same rounds: before and after
under the same load. ``--profile`` also runs each task's furcate command once under cProfile and
lists where its launcher's time went. Run: ``python bench/startup.py`` (~10 min with 3 rounds
on 2 cores; twice that with ``--before``); the DDP part alone: ``--parts ddp`` (~1 min).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.commands import app_command, empty_store, run_command
from bench.harness import machine, publish
from bench.timeline import (
    Job,
    first_start,
    job_from,
    list_schedule,
    read_timings,
    slot_gaps,
    span,
)
from furcate_hydra.store.store_template import CACHE_VAR, seed_new_store

T = TypeVar("T")

APPS_DIR = Path(__file__).resolve().parent / "apps"
APPS = {"light": APPS_DIR / "startup_light_app.py", "torch": APPS_DIR / "startup_torch_app.py"}
SLEEP_APP = APPS_DIR / "sleep_app.py"
DDP_APP = APPS_DIR / "ddp_bench_app.py"
DDP: dict[str, list[str]] = {  # a one-job sweep: a basic launcher's rank replays the sweep
    "basic": ["hydra/launcher=basic"],
    "furcate": ["hydra/launcher=furcate"],
}
OPTUNA_APP = APPS_DIR / "optuna_sleep_app.py"
FIRST_JOB: dict[str, list[str]] = {
    "basic": ["hydra/launcher=basic"],
    "furcate": [],
    "furcate, no MLflow": ["hydra.launcher.mlflow.enabled=false"],
}
HANDOFF_JOBS, HANDOFF_SLEEP_S = 12, 0.2
HANDOFF: dict[str, list[str]] = {
    "basic": ["hydra/launcher=basic"],
    "furcate": ["hydra.launcher.gpus=[0,1]"],
    "furcate sweeper": ["hydra.launcher.gpus=[0,1]", "hydra/sweeper=furcate"],
}
TRIALS, TRIAL_SLOTS = 16, 4
BEFORE = " (before)"  # the suffix of a variant run with --before's code
# the code each furcate variant runs with: this checkout (None), and --before's
CODES: dict[str, str | None] = {"": None}
TRIAL_DURATIONS = (0.5, 1.0, 2.0, 3.0)
FOUR_SLOTS = f"hydra.launcher.gpus=[{','.join(str(i) for i in range(TRIAL_SLOTS))}]"


@dataclass(frozen=True)
class Command:
    """One CLI run: when it began and returned, its jobs, and what else used the CPU."""

    began: float
    ended: float
    jobs: list[Job]
    output: str
    others_cpu_share: float
    imported_at: float | None = None  # when the task module's imports were done

    @property
    def after_imports_s(self) -> float | None:
        """The first job's start after the task module's imports (the launchers' own part)."""
        if self.imported_at is None:
            return None
        return first_start(self.jobs) - self.imported_at

    @property
    def wall_s(self) -> float:
        return self.ended - self.began

    @property
    def first_start_s(self) -> float:
        return first_start(self.jobs) - self.began


def run_cli(
    app: Path,
    overrides: Sequence[str],
    run_dir: Path,
    sweep: str,
    timing: str = "times.json",
    code: str | None = None,
    cache: Path | None = None,
) -> Command:
    """Run ``app -m`` in ``run_dir`` (its store: ``run_dir/mlflow.db``), with furcate from
    ``code`` (a checkout) or this one, its new-store templates in ``cache`` (None: the
    user's); read the jobs' times."""
    sweep_dir = run_dir / sweep
    overrides = [*overrides, f"hydra.sweep.dir={sweep_dir}"]
    env = code_env(code)
    if cache is not None:
        env[CACHE_VAR] = str(cache)
    done = run_command(app_command(app, overrides), cwd=run_dir, env=env)
    done.check(" ".join(done.command))
    timings = read_timings(sweep_dir, timing, pattern="**/{name}").values()
    jobs = [job_from(info) for info in timings]
    imported = [info.get("imported_at") for info in timings]
    first = min(imported) if imported and None not in imported else None
    return Command(done.began, done.ended, jobs, done.output, done.others_cpu_share, first)


def code_env(code: str | None) -> dict[str, str]:
    """This environment for a command with furcate from ``code`` (a checkout) or this one,
    and the launcher's default store (MLflow's tracking URI unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if code is not None:
        env["PYTHONPATH"] = code
    return env


def fresh_dir(root: Path, name: str, template: Path | None) -> Path:
    """A directory for one command, holding a copy of the empty store (None: no store yet,
    as in a new directory)."""
    run_dir = root / "".join(c if c.isalnum() or c == "-" else "_" for c in name)
    run_dir.mkdir(parents=True)
    if template is not None:
        shutil.copy(template, run_dir / "mlflow.db")
    return run_dir


def rotated(names: Sequence[T], r: int) -> list[T]:
    """Variants in turns: a different one goes first each round."""
    k = r % len(names)
    return list(names[k:]) + list(names[:k])


def with_codes(variants: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """Each variant under each code (the basic launcher's runs no furcate code): its name,
    the variant, the code."""
    return [
        (variant + suffix, variant, code)
        for variant in variants
        for suffix, code in (CODES.items() if variant != "basic" else [("", None)])
    ]


# -- the measures ------------------------------------------------------------------------


def first_job_round(root: Path, template: Path, r: int) -> dict[str, dict[str, Any]]:
    """Each task under each launcher: first job start and wall; furcate's rerun, all skipped."""
    out: dict[str, dict[str, Any]] = {}
    for task, app in APPS.items():
        row: dict[str, Any] = {}
        for name, variant, code in rotated(with_codes(list(FIRST_JOB)), r):
            run_dir = fresh_dir(root, f"first-{r}-{task}-{name}", template)
            overrides = ["i=0,1", "d=0.0", *FIRST_JOB[variant]]
            done = run_cli(app, overrides, run_dir, "sweep", code=code)
            if len(done.jobs) != 2:
                raise RuntimeError(f"{task} {name}: {len(done.jobs)} of 2 jobs ran")
            after = done.after_imports_s
            row[name] = {
                "first_start_s": round(done.first_start_s, 3),
                "after_imports_s": None if after is None else round(after, 3),
                "wall_s": round(done.wall_s, 3),
                "others_cpu_share": done.others_cpu_share,
            }
            if variant == "furcate":
                again = run_cli(app, overrides, run_dir, "rerun", code=code)
                if again.jobs or "skipped 2 of 2" not in again.output:
                    raise RuntimeError(f"{task}: the rerun ran jobs:\n{again.output[-2000:]}")
                row[f"{name} rerun, all skipped"] = {
                    "wall_s": round(again.wall_s, 3),
                    "others_cpu_share": again.others_cpu_share,
                }
            print(f"round {r + 1} first job, {task}, {name}: {done.first_start_s:.2f} s")
        out[task] = row
    return out


def fresh_round(root: Path, template: Path, r: int) -> dict[str, dict[str, Any]]:
    """The torch task's first job in a new directory (no ``mlflow.db`` yet), each launcher:
    Hydra's basic one (the anchor); furcate whose new store is a copy of the template kept
    from an earlier sweep; furcate on a machine with no template yet (it makes it: MLflow's
    migrations, once per MLflow version); furcate with the store made (a rerun's case)."""
    cases: dict[str, tuple[list[str], Path | None, Path | None]] = {
        "basic": (["hydra/launcher=basic"], None, None),
        "furcate, new store (template kept)": ([], None, root / "cache"),
        "furcate, new store (no template yet)": ([], None, root / f"cache-{r}"),
        "furcate, store made": ([], template, root / "cache"),
    }
    row: dict[str, Any] = {}
    for name in rotated(list(cases), r):
        overrides, store, cache = cases[name]
        run_dir = fresh_dir(root, f"fresh-{r}-{name}", store)
        done = run_cli(APPS["torch"], ["i=0,1", "d=0.0", *overrides], run_dir, "sweep",
                       cache=cache)  # fmt: skip
        if len(done.jobs) != 2:
            raise RuntimeError(f"fresh {name}: {len(done.jobs)} of 2 jobs ran")
        row[name] = {
            "first_start_s": round(done.first_start_s, 3),
            "others_cpu_share": done.others_cpu_share,
        }
        print(f"round {r + 1} fresh dir, {name}: {done.first_start_s:.2f} s")
    return {"torch": row}


def handoff_round(root: Path, template: Path, r: int) -> dict[str, dict[str, Any]]:
    """Gaps between consecutive jobs on a slot, per task and launcher."""
    out: dict[str, dict[str, Any]] = {}
    for task, app in APPS.items():
        row: dict[str, Any] = {}
        for name, variant, code in rotated(with_codes(list(HANDOFF)), r):
            run_dir = fresh_dir(root, f"handoff-{r}-{task}-{name}", template)
            overrides = [f"i=range(0,{HANDOFF_JOBS})", f"d={HANDOFF_SLEEP_S}", *HANDOFF[variant]]
            done = run_cli(app, overrides, run_dir, "sweep", code=code)
            if len(done.jobs) != HANDOFF_JOBS:
                raise RuntimeError(f"{task} {name}: {len(done.jobs)} jobs ran")
            gaps = slot_gaps(done.jobs)
            row[name] = {
                "gaps_s": [round(g, 4) for g in gaps],
                "gap_median_s": round(statistics.median(gaps), 4),
                "wall_s": round(done.wall_s, 3),
                "others_cpu_share": done.others_cpu_share,
            }
            median = row[name]["gap_median_s"]
            print(f"round {r + 1} handoff, {task}, {name}: gap median {median} s")
        out[task] = row
    return out


def optuna_round(root: Path, template: Path, r: int) -> dict[str, dict[str, Any]]:
    """16 short trials (and 16 grid jobs) on 4 slots against their zero-overhead schedule."""
    out: dict[str, dict[str, Any]] = {}
    for name, variant, code in rotated(with_codes(["optuna", "grid"]), r):
        run_dir = fresh_dir(root, f"optuna-{r}-{name}", template)
        if variant == "optuna":
            overrides = [
                f"d=choice({','.join(str(d) for d in TRIAL_DURATIONS)})",
                "x=interval(0.0,1.0)",
                f"hydra.sweeper.n_trials={TRIALS}",
                "hydra/sweeper/sampler=random",
                f"hydra.sweeper.sampler.seed={r}",
                f"hydra.sweeper.storage=sqlite:///{run_dir / 'optuna.db'}",
                FOUR_SLOTS,
            ]
            done = run_cli(OPTUNA_APP, overrides, run_dir, "sweep", "trial.json", code)
            durations = _by_num(run_dir / "sweep", "trial.json", "duration")
        else:
            draw = random.Random(r)
            durations = [draw.choice(TRIAL_DURATIONS) for _ in range(TRIALS)]
            overrides = [
                f"i=range(0,{TRIALS})",
                f"durations=[{','.join(str(d) for d in durations)}]",
                "hydra/sweeper=furcate",
                FOUR_SLOTS,
            ]
            done = run_cli(SLEEP_APP, overrides, run_dir, "sweep", "sleep.json", code)
        if len(done.jobs) != TRIALS:
            raise RuntimeError(f"{name}: {len(done.jobs)} of {TRIALS} jobs ran")
        sweep_s = span(done.jobs)
        model = list_schedule(durations, TRIAL_SLOTS)
        gaps = slot_gaps(done.jobs)
        out[name] = {
            "sweep_s": round(sweep_s, 3),
            "zero_overhead_s": round(model, 3),
            "over_model": round(sweep_s / model, 4),
            "gaps_s": [round(g, 4) for g in gaps],
            "gap_median_s": round(statistics.median(gaps), 4),
            "gap_max_s": round(max(gaps), 4),
            "wall_s": round(done.wall_s, 3),
            "durations_s": durations,
            "others_cpu_share": done.others_cpu_share,
        }
        print(f"round {r + 1} {name}: {sweep_s:.2f} s = {sweep_s / model:.3f} x zero overhead")
    return out


def ddp_round(root: Path, template: Path, r: int) -> dict[str, dict[str, Any]]:
    """A DDP job under each launcher: its task entered to every rank training."""
    row: dict[str, Any] = {}
    for name, variant, code in rotated(with_codes(list(DDP)), r):
        run_dir = fresh_dir(root, f"ddp-{r}-{name}", template)
        overrides = ["lr=0.01", "strategy=ddp", *DDP[variant]]
        done = run_cli(DDP_APP, overrides, run_dir, "sweep", code=code)
        ranks = [
            json.loads(line)
            for path in (run_dir / "sweep").rglob("ranks.jsonl")
            for line in path.read_text().splitlines()
        ]
        if sorted(rank["rank"] for rank in ranks) != [0, 1]:
            raise RuntimeError(f"ddp {name}: ranks {ranks} trained, not 0 and 1")
        entered = next(rank["entered"] for rank in ranks if rank["rank"] == 0)
        training = max(rank["train_start"] for rank in ranks)
        row[name] = {
            "job_start_s": round(training - entered, 3),
            "first_training_s": round(training - done.began, 3),
            "wall_s": round(done.wall_s, 3),
            "others_cpu_share": done.others_cpu_share,
        }
        print(f"round {r + 1} ddp job start, {name}: {training - entered:.2f} s")
    return {"ddp": row}


def ddp_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds; each furcate variant's job start over the basic launcher's."""
    names = list(rounds[0]["ddp"])
    medians = {n: median_of(rounds, "ddp", n, "job_start_s") for n in names}
    return {
        "job_start_s": medians,
        "first_training_s": {n: median_of(rounds, "ddp", n, "first_training_s") for n in names},
        "over_basic": {
            n: round(m / medians["basic"], 3) for n, m in medians.items() if n != "basic"
        },
        "others_cpu_share_max": max(
            row["others_cpu_share"] for r in rounds for row in r["ddp"].values()
        ),
    }


def show_ddp(figures: dict[str, Any]) -> None:
    ddp = figures["ddp"]
    print(f"\nDDP job (2 ranks, CPU), task entered to every rank training, medians of "
          f"{figures['rounds']} rounds:")  # fmt: skip
    for name, seconds in ddp["job_start_s"].items():
        over = ddp["over_basic"].get(name)
        ratio = "" if over is None else f"  ({over:.3f} x basic)"
        print(f"  {name:<18} {seconds:6.3f} s{ratio}")


def _by_num(sweep_dir: Path, name: str, key: str) -> list[float]:
    infos = read_timings(sweep_dir, name, pattern="**/{name}").values()
    return [float(i[key]) for i in sorted(infos, key=lambda i: int(i["num"]))]


# -- the profile ---------------------------------------------------------------------------

# What the profile lists besides furcate's own functions: the imports that dominate start-up.
IMPORTS = {
    "mlflow/__init__.py": "import mlflow",
    "mlflow/store/tracking/sqlalchemy_store.py": "import MLflow's SQL store",
    "torch/__init__.py": "import torch",
    "pytorch_lightning/__init__.py": "import pytorch_lightning",
}


def profile(root: Path, template: Path) -> dict[str, Any]:
    """Each task's furcate 2-job command once under cProfile, with each code: the launcher's
    biggest items, cumulative seconds."""
    out: dict[str, Any] = {}
    for task, app in APPS.items():
        for suffix, code in CODES.items():
            run_dir = fresh_dir(root, f"profile-{task}{suffix}", template)
            prof = run_dir / "launcher.prof"
            overrides = ["i=0,1", f"hydra.sweep.dir={run_dir / 'sweep'}"]
            command = app_command(app, overrides, python=["-m", "cProfile", "-o", str(prof)])
            done = run_command(command, cwd=run_dir, env=code_env(code))
            wall = done.check(f"profile {task}{suffix}").ended - done.began
            out[f"{task}{suffix}"] = {"wall_s": round(wall, 3), "cumulative_s": top_items(prof)}
            print(f"profile {task}{suffix}: {wall:.2f} s under cProfile")
    return out


def top_items(prof: Path) -> dict[str, float]:
    """furcate's functions over 50 ms and the big imports, by cumulative seconds."""
    # (file, line, func) -> (..., cumulative, ...); not in typeshed's Stats
    stats: Any = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    rows = []
    for (file, _line, func), (_, _, _, cumulative, _) in stats.items():
        label = None
        for package in ("furcate_hydra/", "hydra_plugins/"):
            if package in file and cumulative >= 0.05:
                label = f"{file[file.index(package) :]}:{func}"
        for suffix, name in IMPORTS.items():
            if file.endswith(suffix) and func == "<module>":
                label = name
        if label is not None:
            rows.append((label, round(cumulative, 3)))
    rows.sort(key=lambda row: -row[1])
    return dict(rows[:30])


# -- report --------------------------------------------------------------------------------


def median_of(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for r in rounds:
        value: Any = r
        for key in path:
            value = value[key]
        values.append(float(value))
    return round(statistics.median(values), 4)


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    first, hand, opt = rounds["first_job"], rounds["handoff"], rounds["optuna"]
    summary: dict[str, Any] = {"first_job": {}, "skipped": {}, "handoff": {}, "optuna": {}}
    for task in APPS:
        row = summary["first_job"][task] = {
            name: median_of(first, task, name, "first_start_s")
            for name, _, _ in with_codes(list(FIRST_JOB))
        }
        for name, variant, _ in with_codes(list(FIRST_JOB)):
            if variant == "basic":
                continue
            later = [
                r[task][name]["first_start_s"] - r[task]["basic"]["first_start_s"] for r in first
            ]
            row[f"{name} - basic"] = round(statistics.median(later), 3)
        summary["skipped"][task] = {
            f"rerun{suffix}_wall_s": median_of(
                first, task, f"furcate{suffix} rerun, all skipped", "wall_s"
            )
            for suffix in CODES
        }
        summary["skipped"][task]["basic_sweep_wall_s"] = median_of(first, task, "basic", "wall_s")
        summary["handoff"][task] = {
            name: {
                "gap_median_s": round(
                    statistics.median(g for r in hand for g in r[task][name]["gaps_s"]), 4
                ),
                "gap_max_s": max(g for r in hand for g in r[task][name]["gaps_s"]),
            }
            for name, _, _ in with_codes(list(HANDOFF))
        }
    for name, _, _ in with_codes(["optuna", "grid"]):
        summary["optuna"][name] = {
            "over_model": median_of(opt, name, "over_model"),
            "gap_median_s": round(statistics.median(g for r in opt for g in r[name]["gaps_s"]), 4),
            "gap_max_s": max(g for r in opt for g in r[name]["gaps_s"]),
        }
    shares = [
        v["others_cpu_share"]
        for part in rounds.values()
        for r in part
        for row in r.values()
        for v in (row.values() if "others_cpu_share" not in row else [row])
    ]
    summary["others_cpu_share_median"] = round(statistics.median(shares), 3)
    return summary


def fresh_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds, and each furcate case over the basic launcher's (seconds)."""
    names = list(rounds[0]["torch"])
    medians = {n: median_of(rounds, "torch", n, "first_start_s") for n in names}
    basic = medians["basic"]
    return {
        "first_start_s": medians,
        "over_basic_s": {n: round(m - basic, 3) for n, m in medians.items() if n != "basic"},
        "others_cpu_share_max": max(
            row["others_cpu_share"] for r in rounds for row in r["torch"].values()
        ),
    }


def show_fresh(figures: dict[str, Any]) -> None:
    fresh = figures["fresh"]
    print(f"\nfirst job in a new directory, torch task, medians of {figures['rounds']} rounds:")
    for name, seconds in fresh["first_start_s"].items():
        over = fresh["over_basic_s"].get(name)
        print(f"  {name:<38} {seconds:6.2f} s" + ("" if over is None else f"  ({over:+.2f} s)"))


def show(figures: dict[str, Any]) -> None:
    s = figures["summary"]
    others = s["others_cpu_share_median"]
    print(f"\nmedians of {figures['rounds']} rounds; others used {others:.0%} of the CPU")
    print("first job's first line, s after the command:")
    for task, row in s["first_job"].items():
        print(f"  {task:<6} " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print("rerun with every config FINISHED, wall s (anchor: the basic launcher's whole sweep):")
    for task, row in s["skipped"].items():
        print(f"  {task:<6} " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print("gap between consecutive jobs on a slot, median / max s:")
    for task, row in s["handoff"].items():
        cells = [f"{k} {v['gap_median_s']:.3f} / {v['gap_max_s']:.3f}" for k, v in row.items()]
        print(f"  {task:<6} " + ", ".join(cells))
    print(f"{TRIALS} jobs on {TRIAL_SLOTS} slots, first start to last end ÷ zero overhead:")
    for name, row in s["optuna"].items():
        print(
            f"  {name:<15} {row['over_model']:.3f}, gaps median {row['gap_median_s']:.3f} / "
            f"max {row['gap_max_s']:.3f} s"
        )
    for task, p in figures.get("profile", {}).items():
        print(f"profile, {task} task ({p['wall_s']:.2f} s under cProfile), cumulative s:")
        for label, seconds in list(p["cumulative_s"].items())[:15]:
            print(f"  {seconds:>7.3f}  {label}")
    if "fresh" in figures:
        show_fresh(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="first_job,handoff,optuna")
    parser.add_argument("--profile", action="store_true", help="also profile the start-up")
    parser.add_argument("--before", help="a checkout of older code to run every variant with")
    args = parser.parse_args()
    if args.before:
        CODES[BEFORE] = str(Path(args.before).resolve())
    at_start = machine()
    parts = args.parts.split(",")
    measures = {
        "first_job": first_job_round,
        "fresh": fresh_round,
        "handoff": handoff_round,
        "optuna": optuna_round,
        "ddp": ddp_round,
    }
    rounds: dict[str, list[dict[str, Any]]] = {part: [] for part in measures}
    figures: dict[str, Any] = {"rounds": args.rounds, "before": args.before}
    with tempfile.TemporaryDirectory(prefix="furcate-startup-") as tmp:
        root = Path(tmp)
        template = empty_store(root / "template" / "mlflow.db")
        if "fresh" in parts:  # the template an earlier sweep on this machine kept
            (root / "seeded").mkdir()
            os.environ[CACHE_VAR] = str(root / "cache")
            seed_new_store(root / "seeded" / "mlflow.db")
            del os.environ[CACHE_VAR]
        for r in range(args.rounds):
            for part in parts:
                rounds[part].append(measures[part](root, template, r))
        if args.profile:
            figures["profile"] = profile(root, template)
    if "fresh" in parts:
        figures["fresh"] = fresh_summary(rounds["fresh"])
    if set(parts) >= {"first_job", "handoff", "optuna"}:
        figures["summary"] = summarize(rounds)
    if "ddp" in parts:
        figures["ddp"] = ddp_summary(rounds["ddp"])
    figures["by_round"] = rounds
    publish("startup", at_start, figures, show_parts)


def show_parts(figures: dict[str, Any]) -> None:
    """Each part's summary that was measured; everything, where none has one."""
    if "summary" in figures:
        show(figures)
    elif "fresh" in figures:
        show_fresh(figures)
    if "ddp" in figures:
        show_ddp(figures)
    if not {"summary", "fresh", "ddp"} & figures.keys():
        print(figures)


if __name__ == "__main__":
    main()
