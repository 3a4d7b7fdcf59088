"""The launcher process's memory as a sweep grows: does it keep anything per finished job?

Each run is a real ``python bench/apps/trivial_app.py -m 'i=range(0,N)'`` in a subprocess, on
the furcate launcher (default slots: 2 CPU slots here, nothing preloaded), every job recorded
in a fresh MLflow sqlite store in a temp dir. Each job returns at once, so the launcher's own
work per job is all that runs. A Hydra callback in the launcher process (``bench/memory_probe.py``)
samples its RSS while the sweep runs and reads it again at the sweep's end, while the sweeper's
return value is still held. Variants:

  furcate  ``hydra/sweeper=furcate`` streaming onto the launcher's slots;
  basic    Hydra's BasicSweeper, one ``launch`` of every job (the anchor: Hydra keeps every
           job's JobReturn, with its config, by design).

Figures: RSS when the multirun starts (before the sweeper and the launcher load, ~31 MB), at
its end and its peak; the end-RSS ratio between the largest and the smallest N (goal for the
furcate sweeper: ≤ 1.1) and the growth per job between them; jobs/s over the whole sweep
(first sweeper call to its return) and over the first and the last tenth of the jobs; the
share of the machine's CPU that other work used meanwhile (it moves jobs/s, not memory).

``--trace`` runs each variant once more at the smallest N with tracemalloc and gc counts, and
prints what is left allocated at the end, by line and by type (slow: to find, not to time).

Run: ``python bench/launcher_memory.py`` (1,000 and 4,000 jobs, each variant: ~40 min on
2 cores), ``--jobs 1000 10000 --variants furcate`` for the issue's sizes, ``--jobs 300 --trace``
while looking for what holds memory.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.commands import ROOT, app_command, empty_store, run_command
from bench.harness import machine, publish

APP = ROOT / "bench" / "apps" / "trivial_app.py"
VARIANTS: dict[str, list[str]] = {
    "furcate": ["hydra/sweeper=furcate"],
    "basic": [],
}
COMMON = [
    "hydra.launcher.preload=[]",  # the jobs only return a number
    "+hydra.callbacks.memory_probe._target_=bench.memory_probe.MemoryProbe",
]


def sweep_env(store: Path) -> dict[str, str]:
    """This environment for a sweep of the bench's app recording into ``store``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MLFLOW_TRACKING_URI": f"sqlite:///{store}",
    }


def run_sweep(variant: str, jobs: int, template: Path, trace: bool) -> dict[str, Any]:
    """One sweep through the CLI in a fresh temp dir; the probe's report plus wall time."""
    with tempfile.TemporaryDirectory(prefix="furcate-memory-") as tmp:
        work = Path(tmp)
        store = work / "mlflow.db"
        shutil.copyfile(template, store)
        report = work / "memory.json"
        overrides = [
            f"i=range(0,{jobs})",
            f"hydra.sweep.dir={work / 'sweep'}",
            *COMMON,
            f"+hydra.callbacks.memory_probe.out={report}",
            f"+hydra.callbacks.memory_probe.trace={str(trace).lower()}",
            *VARIANTS[variant],
        ]
        done = run_command(app_command(APP, overrides), cwd=work, env=sweep_env(store))
        if done.returncode != 0 or not report.exists():
            raise RuntimeError(f"{variant} N={jobs} failed ({done.returncode}):\n{done.stderr}")
        figures: dict[str, Any] = json.loads(report.read_text())
        figures["pace"] = pace(work / "sweep" / "run_data.csv")
    figures["command_wall_s"] = round(done.wall_s, 2)
    # the machine's CPU that other people's work used meanwhile: it slows jobs/s, not memory
    figures["others_cpu_share"] = done.others_cpu_share
    figures["jobs_per_s"] = round(jobs / figures["sweep_s"], 2)
    return figures


def pace(run_data_csv: Path) -> dict[str, float]:
    """Jobs/s over the first and the last tenth of the jobs (by end time): whether the
    launcher slows down as the sweep and its store grow."""
    with run_data_csv.open(newline="") as handle:
        ends = sorted(float(row["end"]) for row in csv.DictReader(handle))
    tenth = max(len(ends) // 10, 2)
    first, last = ends[:tenth], ends[-tenth:]
    return {
        "first_tenth_jobs_per_s": round((tenth - 1) / (first[-1] - first[0]), 2),
        "last_tenth_jobs_per_s": round((tenth - 1) / (last[-1] - last[0]), 2),
    }


def compare(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """End RSS of the largest N over the smallest, and the growth per job between them."""
    small, large = min(runs), max(runs)
    a, b = runs[small], runs[large]
    return {
        "end_rss_ratio": round(b["rss_end_kib"] / a["rss_end_kib"], 3),
        "peak_rss_ratio": round(b["rss_peak_kib"] / a["rss_peak_kib"], 3),
        "kib_per_job": round((b["rss_end_kib"] - a["rss_end_kib"]) / (large - small), 2),
    }


def show(figures: dict[str, Any]) -> None:
    print(
        f"{'variant':8} {'N':>6} {'start MB':>9} {'end MB':>8} {'peak MB':>8} {'jobs/s':>7} "
        f"{'first/last tenth jobs/s':>24} {'others CPU':>10}"
    )
    for variant, runs in figures["runs"].items():
        for jobs, run in sorted(runs.items(), key=lambda item: int(item[0])):
            print(
                f"{variant:8} {jobs:>6} {run['rss_start_kib'] / 1024:9.1f} "
                f"{run['rss_end_kib'] / 1024:8.1f} {run['rss_peak_kib'] / 1024:8.1f} "
                f"{run['jobs_per_s']:7.2f} {run['pace']['first_tenth_jobs_per_s']:>12} "
                f"{run['pace']['last_tenth_jobs_per_s']:>11} {run['others_cpu_share']:>10}"
            )
    for variant, ratio in figures["ratios"].items():
        print(f"{variant}: {ratio}")
    for variant, trace in figures.get("trace", {}).items():
        print(f"\n== {variant}: traced {trace['traced_kib']} KiB left at the end; by line:")
        for stat in trace["by_line"][:15]:
            print(f"  {stat['kib']:7} KiB {stat['count']:7}  {stat['at']}")
        print("  objects grown, by type:")
        for name, count in trace["object_growth"][:15]:
            print(f"  {count:8}  {name}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--trace", action="store_true", help="also find what holds memory")
    args = parser.parse_args(argv)
    at_start = machine()
    with tempfile.TemporaryDirectory(prefix="furcate-memory-store-") as tmp:
        template = empty_store(Path(tmp) / "template.db")
        runs: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in args.variants}
        for jobs in sorted(args.jobs):
            for variant in args.variants:
                runs[variant][jobs] = run_sweep(variant, jobs, template, trace=False)
                run = runs[variant][jobs]
                print(
                    f"{variant} N={jobs}: end {run['rss_end_kib'] / 1024:.1f} MB, "
                    f"{run['jobs_per_s']} jobs/s",
                    flush=True,
                )
        figures: dict[str, Any] = {
            "runs": runs,
            "ratios": {v: compare(r) for v, r in runs.items() if len(r) > 1},
        }
        if args.trace:
            small = min(args.jobs)
            figures["trace"] = {v: run_sweep(v, small, template, trace=True) for v in args.variants}
    publish("launcher_memory", at_start, figures, show)


if __name__ == "__main__":
    main()
