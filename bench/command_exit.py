"""The command's end: from a sweep's last job ending to the user's prompt, with
``hydra.launcher.fast_exit`` (the default) against Python's usual exit (``fast_exit=false``,
the anchor), in the same rounds.

Every command is a fresh ``python bench/apps/startup_torch_app.py -m i=0,1`` (its module
imports torch and pytorch_lightning, as a Lightning app's does) in its own directory with an
empty MLflow store (``mlflow.db``, the launcher's default), so the launcher holds what a
user's does at its end: torch, Lightning, Hydra, MLflow and its SQL store. The tail is the
command's end less the later of its jobs' ends (each job writes the time its task ended);
Hydra's basic launcher (no MLflow) runs the same sweep for scale. After each furcate command
the store must be whole on its own: no ``mlflow.db-wal`` left beside it, every run ended.

The same for the ``furcate`` command: ``furcate status`` of the round's fast_exit sweep, as
installed, against the same command with its quick exit switched off in its process (the
anchor; the command has no option for it), in turns.

Variants take turns within a round; figures are medians over rounds, with the share of the
machine's CPU other processes used meanwhile.

    python bench/command_exit.py              # 5 rounds, ~2.5 min on 2 cores
    python bench/command_exit.py --rounds 9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.commands import ROOT, app_command, empty_store, run_command
from bench.harness import machine, publish
from bench.startup import code_env, fresh_dir, rotated

APP = ROOT / "bench" / "apps" / "startup_torch_app.py"
VARIANTS = {
    "fast_exit": ["hydra.launcher.fast_exit=true"],
    "usual_exit": ["hydra.launcher.fast_exit=false"],  # the anchor
    "basic": ["hydra/launcher=basic"],
}


def one_command(run_dir: Path, variant: str) -> dict[str, Any]:
    """One sweep of two jobs under ``variant`` in ``run_dir`` (``fresh_dir``'s): its tail, its
    wall time, its store's state."""
    sweep_dir = run_dir / "sweep"
    overrides = ["i=0,1", "d=0", f"hydra.sweep.dir={sweep_dir}", *VARIANTS[variant]]
    done = run_command(app_command(APP, overrides), cwd=run_dir, env=code_env(None))
    done.check(variant)
    ends = [json.loads(p.read_text())["ended_at"] for p in sweep_dir.glob("*/times.json")]
    if len(ends) != 2:
        raise RuntimeError(f"{variant}: {len(ends)} of 2 jobs wrote their times")
    figures: dict[str, Any] = {
        "tail_s": round(done.ended - max(ends), 3),
        "wall_s": round(done.wall_s, 3),
        "others_cpu_share": done.others_cpu_share,
    }
    if variant != "basic":
        figures["wal_left"] = (run_dir / "mlflow.db-wal").exists()
        figures["runs_not_ended"] = _runs_not_ended(run_dir / "mlflow.db")
    return figures


STATUS = {
    "status_fast": "from furcate_hydra.cli.main import main",
    # the anchor: the same command with the process's quick exit never installed
    "status_usual": "import furcate_hydra.quick_exit as q\n"
    "q.end_quickly = lambda: None\n"
    "from furcate_hydra.cli.main import main",
}


def status_command(run_dir: Path, variant: str) -> float:
    """Wall time of ``furcate status`` of ``run_dir``'s sweep, its store the default one."""
    code = f"import sys\n{STATUS[variant]}\nsys.exit(main(['status', sys.argv[1]]))"
    command = [sys.executable, "-c", code, str(run_dir / "sweep")]
    done = run_command(command, cwd=run_dir, env=code_env(None)).check(variant)
    if "FINISHED" not in done.stdout:
        raise RuntimeError(f"{variant}: no status read:\n{done.stdout[-2000:]}")
    return round(done.wall_s, 3)


def _runs_not_ended(store: Path) -> int:
    """Runs in the store without an end time (the sweep's and its jobs'), read by sqlite."""
    with contextlib.closing(sqlite3.connect(store)) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM runs WHERE end_time IS NULL").fetchone()
    return int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    at_start = machine()
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    status: dict[str, list[float]] = {name: [] for name in STATUS}
    with tempfile.TemporaryDirectory(prefix="furcate-command-exit-") as tmp:
        root = Path(tmp)
        template = empty_store(root / "empty.db")
        for r in range(args.rounds):
            run_dirs = {}
            for name in rotated(list(VARIANTS), r):
                run_dirs[name] = fresh_dir(root, f"{name}-{r}", template)
                rounds[name].append(one_command(run_dirs[name], name))
            for name in rotated(list(STATUS), r):  # of the round's fast_exit sweep
                status[name].append(status_command(run_dirs["fast_exit"], name))
    figures: dict[str, Any] = {"rounds": rounds, "status_rounds": status}
    for name, walls in status.items():
        figures[name] = {"wall_s": statistics.median(walls)}
    figures["status_ratio"] = round(
        figures["status_fast"]["wall_s"] / figures["status_usual"]["wall_s"], 3
    )
    for name, runs in rounds.items():
        figures[name] = {
            "tail_s": statistics.median(run["tail_s"] for run in runs),
            "wall_s": statistics.median(run["wall_s"] for run in runs),
            "others_cpu_share": max(run["others_cpu_share"] for run in runs),
        }
        if name != "basic":
            figures[name]["wal_left"] = sum(run["wal_left"] for run in runs)
            figures[name]["runs_not_ended"] = sum(run["runs_not_ended"] for run in runs)
    figures["tail_ratio"] = round(
        figures["fast_exit"]["tail_s"] / figures["usual_exit"]["tail_s"], 3
    )
    figures["wall_ratio"] = round(
        figures["fast_exit"]["wall_s"] / figures["usual_exit"]["wall_s"], 3
    )
    publish("command_exit", at_start, figures, _show)


def _show(figures: dict[str, Any]) -> None:
    print(f"{'variant':>10} {'tail s':>7} {'wall s':>7} {'WAL left':>8} {'not ended':>9}")
    for name in VARIANTS:
        row = figures[name]
        print(
            f"{name:>10} {row['tail_s']:>7.2f} {row['wall_s']:>7.2f} "
            f"{row.get('wal_left', '-'):>8} {row.get('runs_not_ended', '-'):>9}"
        )
    print(
        f"fast_exit / usual exit: tail {figures['tail_ratio']:.3f} x, "
        f"command {figures['wall_ratio']:.3f} x"
    )
    print(
        f"furcate status: {figures['status_fast']['wall_s']:.2f} s against "
        f"{figures['status_usual']['wall_s']:.2f} s = {figures['status_ratio']:.3f} x"
    )


if __name__ == "__main__":
    main()
