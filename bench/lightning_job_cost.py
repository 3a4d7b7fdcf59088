"""What one more Lightning job costs a sweep: its CPU beyond the command's start.

The app is the fused-sweep bench's tiny MLP (``bench/apps/tiny_mlp_app.py``, its own Trainer,
one epoch of 32 batches), a grid of N configs (lr x weight decay) through the CLI:

  furcate   ``hydra/launcher=furcate``, 2 CPU slots: each config a forked job with its own
            MLflow run (params, metrics, checkpoints, history, plots, artifacts);
  basic     Hydra's basic launcher, the anchor: each config in the launcher's own process,
            one after another, nothing recorded beyond the app's own ``result.json``.

Each runs once with 1 config and once with N; a job's marginal CPU is the difference of the two
commands' CPU (theirs and every process they waited for) over N - 1, so that the command's
start (Python, Hydra, torch, Lightning, MLflow's store: seconds) cancels out. Figures: the
marginal CPU and wall per job, furcate / basic as a ratio.

    python bench/lightning_job_cost.py             # N = 32
    python bench/lightning_job_cost.py --configs 16
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.commands import ROOT, app_command, children_cpu_s, empty_store, run_command
from bench.fused_sweep import grid
from bench.harness import machine, publish

APP = ROOT / "bench" / "apps" / "tiny_mlp_app.py"
LAUNCHERS = {"furcate": ["hydra.launcher.fuse=off"], "basic": ["hydra/launcher=basic"]}


def command_cost(work: Path, store: Path, launcher: str, configs: int) -> dict[str, float]:
    """One sweep's CPU (the command's and its waited-for processes') and wall seconds."""
    name = f"{launcher}-{configs}"
    db = work / f"{name}.db"
    shutil.copyfile(store, db)
    overrides = [*LAUNCHERS[launcher], "epochs=1", f"hydra.sweep.dir={work / name}"]
    command = app_command(APP, [*overrides, *grid(configs)])
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    cpu_before = children_cpu_s()
    done = run_command(command, cwd=work, env=env).check(f"the {name} sweep")
    results = list((work / name).glob("*/result.json"))
    if len(results) != configs:
        raise RuntimeError(f"{name}: {len(results)} of {configs} jobs returned")
    return {"cpu_s": round(children_cpu_s() - cpu_before, 2), "wall_s": round(done.wall_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--configs", type=int, default=32)
    args = parser.parse_args()
    at_start = machine()
    figures: dict[str, Any] = {"configs": args.configs, "launchers": {}}
    with tempfile.TemporaryDirectory(prefix="furcate-job-cost-") as tmp:
        work = Path(tmp)
        store = empty_store(work / "empty.db")
        for launcher in LAUNCHERS:
            one = command_cost(work, store, launcher, 1)
            many = command_cost(work, store, launcher, args.configs)
            extra = args.configs - 1
            figures["launchers"][launcher] = {
                "one": one,
                "many": many,
                "cpu_per_job_s": round((many["cpu_s"] - one["cpu_s"]) / extra, 4),
                "wall_per_job_s": round((many["wall_s"] - one["wall_s"]) / extra, 4),
            }
    furcate, basic = figures["launchers"]["furcate"], figures["launchers"]["basic"]
    figures["cpu_ratio"] = round(furcate["cpu_per_job_s"] / basic["cpu_per_job_s"], 3)
    figures["wall_ratio"] = round(furcate["wall_per_job_s"] / basic["wall_per_job_s"], 3)
    publish("lightning_job_cost", at_start, figures, _show)


def _show(figures: dict[str, Any]) -> None:
    print(f"{'launcher':>8} {'1 job cpu':>9} {'N cpu':>8} {'cpu/job':>8} {'wall/job':>8}")
    for name, row in figures["launchers"].items():
        print(
            f"{name:>8} {row['one']['cpu_s']:>9.2f} {row['many']['cpu_s']:>8.2f} "
            f"{row['cpu_per_job_s']:>8.3f} {row['wall_per_job_s']:>8.3f}"
        )
    print(f"furcate / basic per job: CPU {figures['cpu_ratio']}, wall {figures['wall_ratio']}")


if __name__ == "__main__":
    main()
