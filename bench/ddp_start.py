"""A DDP job's start and hand-off: the same sweep of DDP jobs under furcate and under Hydra's
basic launcher, in one run.

    python bench/apps/ddp_bench_app.py -m lr=0.01,0.02,0.03 strategy=S [hydra/launcher=furcate
        hydra.launcher.max_workers=1]

Three jobs of 2 ranks each (CPU, gloo, 2 short epochs), one at a time under both launchers (the
basic launcher runs one job at a time; furcate gets one slot to match), for ``ddp`` (ranks
1..N-1 run the script again) and ``ddp_spawn``. furcate records every job in MLflow (its
default: a sqlite store in the sweep's working dir), as a user's sweep does. Figures, from the
ranks' own clocks (``ranks.jsonl``):

  first start   the command's start to the first job's training start (every rank training)
  job start     a job's task entered (rank 0) to every rank training: the ranks' start-up
  hand-off      the median gap from one job's training end (every rank) to the next's start
  wall          the whole command

Under the basic launcher a ``ddp`` rank 1 replays the whole sweep from its own process (what
furcate prevents); it works there only because one job runs at a time. Run:
``python bench/ddp_start.py`` (~2 min on 2 cores); results in bench/results/ddp_start.json.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.commands import app_command, run_command
from bench.harness import machine, publish

APP = Path(__file__).resolve().parent / "apps" / "ddp_bench_app.py"
RATES = ("0.01", "0.02", "0.03")
LAUNCHERS = {
    "basic": [],
    "furcate": ["hydra/launcher=furcate", "hydra.launcher.max_workers=1"],
}


def _sweep(strategy: str, launcher: str, root: Path) -> dict[str, Any]:
    sweep = root / f"{strategy}-{launcher}"
    overrides = [f"lr={','.join(RATES)}", f"strategy={strategy}", f"hydra.sweep.dir={sweep}"]
    done = run_command(app_command(APP, [*overrides, *LAUNCHERS[launcher]]), root, timeout_s=600)
    began, wall = done.began, done.ended - done.began
    if done.returncode != 0:
        return {"failed": done.output[-2000:], "wall_s": round(wall, 2)}
    rows = [
        json.loads(line)
        for path in sweep.rglob("ranks.jsonl")
        for line in path.read_text().splitlines()
    ]
    jobs = []
    for rate in RATES:
        ranks = [row for row in rows if f"{row['lr']:g}" == f"{float(rate):g}"]
        entered = min(row["entered"] for row in ranks if row["rank"] == 0)
        jobs.append(
            {
                "entered": entered,
                "start": max(row["train_start"] for row in ranks),
                "end": max(row["train_end"] for row in ranks),
                "ranks": sorted({row["rank"] for row in ranks}),
            }
        )
    jobs.sort(key=lambda job: job["start"])
    gaps = [later["start"] - earlier["end"] for earlier, later in itertools.pairwise(jobs)]
    return {
        "first_start_s": round(jobs[0]["start"] - began, 2),
        "job_start_s": round(statistics.median(job["start"] - job["entered"] for job in jobs), 2),
        "handoff_s": round(statistics.median(gaps), 2),
        "wall_s": round(wall, 2),
        "ranks_per_job": [job["ranks"] for job in jobs],
    }


def main() -> None:
    at_start = machine()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-start-") as tmp:
        for strategy in ("ddp", "ddp_spawn"):
            for launcher in LAUNCHERS:
                figures[f"{strategy}/{launcher}"] = _sweep(strategy, launcher, Path(tmp))
                print(strategy, launcher, figures[f"{strategy}/{launcher}"], flush=True)
    for strategy in ("ddp", "ddp_spawn"):
        ours, theirs = figures[f"{strategy}/furcate"], figures[f"{strategy}/basic"]
        if "failed" not in ours and "failed" not in theirs:
            figures[f"{strategy}/furcate over basic"] = {
                key: round(ours[key] / theirs[key], 3) if theirs[key] else None
                for key in ("first_start_s", "job_start_s", "handoff_s", "wall_s")
            }
    publish("ddp_start", at_start, figures, lambda f: print(json.dumps(f, indent=1)))


if __name__ == "__main__":
    main()
