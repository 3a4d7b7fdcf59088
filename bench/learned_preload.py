"""An app that imports torch and Lightning inside its main function, swept on 2 CPU slots:
what the fork server learning the jobs' imports saves, beside Hydra's basic launcher.

Each command is a fresh ``python <app> -m i=range(0,8) d=0`` in a directory of its own with
an empty MLflow store, variants taking turns within a round:

  basic          Hydra's basic launcher (the anchor: one config after another, in its process);
  nothing kept   furcate with ``hydra.launcher.preload=[]``: every job imports torch and
                 Lightning itself (what furcate did before it learned);
  learning       furcate's defaults in a new directory: the first jobs import them, report it,
                 the server takes them on while the sweep goes on;
  next sweep     the same command again in the learning variant's directory (new sweep dir,
                 new configs ``i=range(8,16)``): its experiment remembers them;
  set by hand    ``hydra.launcher.preload=[torch,pytorch_lightning]``;
  top imports    furcate's defaults with the app importing them at its top instead
                 (``startup_torch_app.py``), whose launcher has them: the warm bound.

Figures per variant (medians over rounds): the command's wall time, and its ratio to the basic
launcher's in the same round; a job's imports (task start to imports done), mean over jobs.
Run: ``python bench/learned_preload.py`` (~5 min with 2 rounds, ~7 with 3, on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.commands import app_command, empty_store, run_command
from bench.harness import machine, publish
from bench.startup import code_env, fresh_dir, rotated
from bench.timeline import read_timings

APPS_DIR = Path(__file__).resolve().parent / "apps"
INSIDE = APPS_DIR / "startup_inside_app.py"
TOP = APPS_DIR / "startup_torch_app.py"
GRID = ["i=range(0,8)", "d=0"]
NEXT_GRID = ["i=range(8,16)", "d=0"]
SLOTS = ["hydra.launcher.max_workers=2", "hydra.launcher.cpus_per_job=1"]
VARIANTS: dict[str, tuple[Path, list[str]]] = {
    "basic": (INSIDE, ["hydra/launcher=basic"]),
    "nothing kept": (INSIDE, [*SLOTS, "hydra.launcher.preload=[]"]),
    "learning": (INSIDE, SLOTS),
    "set by hand": (INSIDE, [*SLOTS, "hydra.launcher.preload=[torch,pytorch_lightning]"]),
    "top imports": (TOP, SLOTS),
}


def sweep(app: Path, overrides: list[str], run_dir: Path, name: str) -> dict[str, Any]:
    """One command: its wall time, and its jobs' import times."""
    sweep_dir = run_dir / name
    done = run_command(
        app_command(app, [*overrides, f"hydra.sweep.dir={sweep_dir}"]),
        cwd=run_dir,
        env=code_env(None),
    ).check(f"{app.name} {' '.join(overrides)}")
    timings = list(read_timings(sweep_dir, "times.json").values())
    # the inside app's imports run in its task; the top one's before it (not counted)
    imports = [t["imported_at"] - t["started_at"] for t in timings if app == INSIDE]
    return {
        "wall_s": round(done.wall_s, 3),
        "jobs": len(timings),
        "job_imports_s": round(statistics.mean(imports), 3) if imports else None,
        "others_cpu_share": round(done.others_cpu_share, 3),
    }


def one_round(root: Path, template: Path, r: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name in rotated(list(VARIANTS), r):
        app, overrides = VARIANTS[name]
        run_dir = fresh_dir(root / f"round{r}", name, template)
        figures[name] = sweep(app, [*GRID, *overrides], run_dir, "sweep")
        if name == "learning":  # again in its directory: what its experiment remembered
            figures["next sweep"] = sweep(app, [*NEXT_GRID, *overrides], run_dir, "next")
    basic = figures["basic"]["wall_s"]
    for figure in figures.values():
        figure["x_basic"] = round(figure["wall_s"] / basic, 3)
    return figures


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(rounds[0])
    return {
        name: {
            key: statistics.median(r[name][key] for r in rounds)
            for key in ("wall_s", "x_basic", "job_imports_s")
            if all(r[name][key] is not None for r in rounds)
        }
        for name in names
    }


def show(figures: dict[str, Any]) -> None:
    print(f"8 configs on 2 CPU slots, app importing inside main; {figures['rounds']} rounds")
    print(f"{'variant':<14} {'wall s':>8} {'x basic':>8} {'job imports s':>14}")
    for name, row in figures["summary"].items():
        imports = row.get("job_imports_s")
        shown = f"{imports:14.2f}" if imports is not None else f"{'-':>14}"
        print(f"{name:<14} {row['wall_s']:8.2f} {row['x_basic']:8.3f} {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    at_start = machine()
    with tempfile.TemporaryDirectory(prefix="furcate-preload-") as tmp:
        root = Path(tmp)
        template = empty_store(root / "template" / "mlflow.db")
        rounds = [one_round(root, template, r) for r in range(args.rounds)]
    figures = {"rounds": args.rounds, "summary": summarize(rounds), "by_round": rounds}
    publish("learned_preload", at_start, figures, show)


if __name__ == "__main__":
    main()
