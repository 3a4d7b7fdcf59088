"""Fused trials through the CLI: a sweep of tiny configs with ``hydra.launcher.fuse=auto``
against the same sweep one process per config (``fuse=off``, the anchor), on the same slots.

The app (``bench/apps/tiny_mlp_app.py``) is a tiny MLP (32 -> 64 -> 10, 2,048 fixed samples,
batches of 64) with its own Trainer, as users write theirs; the grid is lr x weight decay.
Both sweeps record into an empty sqlite MLflow store of their own and run every furcate
feature (a run per config, checkpoints, history, plots). Figures per training length:

- the command's wall time (Python start to exit) and the sweep's (the launcher's first job
  submitted to its last one back, from its own log lines), each fused/anchor as a ratio;
- the largest difference between a config's returned validation loss fused and alone (the
  two are equal when every member trained as its own run).

The issue's goal: 16 tiny configs fused take at most 0.3x the wall time of one process per
config on this CPU.

    python bench/fused_sweep.py                          # 16 configs, 3 and 30 epochs
    python bench/fused_sweep.py --configs 8 --epochs 3 30 100
    python bench/fused_sweep.py --accelerator cuda --configs 32 --epochs 30   # on a GPU: one
        slot, so the anchor is one job at a time on the GPU (the issue's goal there: 30x)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.commands import ROOT, app_command, empty_store, run_command
from bench.harness import machine, publish

APP = ROOT / "bench" / "apps" / "tiny_mlp_app.py"
LRS = ["0.1", "0.03", "0.01", "0.003", "0.001", "0.0003", "0.0001", "0.00003"]
DECAYS = ["0.0", "0.01", "0.05", "0.1"]
GOAL_RATIO = 0.3
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def grid(configs: int) -> list[str]:
    """``lr=...`` and ``weight_decay=...`` overrides giving ``configs`` configs (4 decays;
    beyond 8 learning rates, as many spread evenly in log scale from 0.1 to 1e-5)."""
    decays = DECAYS[: min(4, configs)]
    count = max(1, configs // len(decays))
    if count <= len(LRS):
        lrs = LRS[:count]
    else:
        lrs = [f"{0.1 * 1e-4 ** (i / (count - 1)):.4g}" for i in range(count)]
    if count * len(decays) != configs:
        raise SystemExit(f"--configs {configs}: use 1-4 or a multiple of 4")
    return [f"lr={','.join(lrs)}", f"weight_decay={','.join(decays)}"]


def sweep(
    work: Path,
    store: Path,
    mode: str,
    configs: int,
    epochs: int,
    accelerator: str = "cpu",
    fuse_max: str | None = None,
) -> dict[str, Any]:
    """One sweep of the grid with ``fuse=mode``: its times and each job's returned value.
    ``fuse_max``: None, unset (learned)."""
    db = work / f"{mode}.db"
    shutil.copyfile(store, db)
    sweep_dir = work / f"sweep-{mode}-{epochs}"
    command = app_command(
        APP,
        [
            f"hydra.launcher.fuse={mode}",
            f"epochs={epochs}",
            f"accelerator={accelerator}",
            f"hydra.sweep.dir={sweep_dir}",
            *grid(configs),
            *([f"hydra.launcher.fuse_max={fuse_max}"] if fuse_max is not None else []),
        ],
    )
    done = run_command(command, cwd=work, env=_env(db)).check(f"the fuse={mode} sweep")
    values = {
        job.name: json.loads((job / "result.json").read_text())["val_loss"]
        for job in sweep_dir.iterdir()
        if (job / "result.json").is_file()
    }
    if len(values) != configs:
        raise RuntimeError(f"fuse={mode}: {len(values)} of {configs} jobs returned")
    return {
        "command_s": round(done.wall_s, 2),
        "sweep_s": round(_sweep_seconds(done.output), 2),
        # jobs whose config trained in a fused group (the others say why not)
        "jobs_fused": sum(1 for n in values if "fused: trained with" in _job_log(sweep_dir / n)),
        # each group's members and how many of them trained at once (fuse_max unset: learned)
        "groups": sorted(
            f"{members}x{width}"
            for n in values
            for members, width in _WIDTH_LINE.findall(_job_log(sweep_dir / n))
        ),
        "values": values,
        "others_cpu_share": round(done.others_cpu_share, 3),
    }


_WIDTH_LINE = re.compile(r"fused: (\d+) member\(s\) train (\d+) at a time")


def _env(db: Path) -> dict[str, str]:
    import os

    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}


def _job_log(job_dir: Path) -> str:
    return "".join(
        (job_dir / name).read_text()
        for name in ("stdout.log", "stderr.log")
        if (job_dir / name).exists()
    )


def _sweep_seconds(output: str) -> float:
    """From the launcher's first job line (``#0 : ...``) to its closing ``sweep of`` line."""
    first = last = None
    for line in output.splitlines():
        match = _STAMP.match(line)
        if match is None:
            continue
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if first is None and "\t#0 :" in line:
            first = at
        if "furcate: sweep of" in line:
            last = at
    if first is None or last is None:
        raise RuntimeError("the sweep's log lines were not found in its output")
    return last - first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--configs", type=int, default=16)
    parser.add_argument("--epochs", type=int, nargs="+", default=[3, 30])
    parser.add_argument(
        "--accelerator", default="cpu", help="the app's Trainer's: cpu, or cuda on a GPU"
    )
    parser.add_argument(
        "--fuse-max",
        default=None,
        help="hydra.launcher.fuse_max of the fused sweep (unset: learned)",
    )
    args = parser.parse_args()
    at_start = machine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="furcate-fused-sweep-") as tmp:
        work = Path(tmp)
        store = empty_store(work / "empty.db")
        for epochs in args.epochs:
            alone = sweep(work, store, "off", args.configs, epochs, args.accelerator)
            fused = sweep(
                work, store, "auto", args.configs, epochs, args.accelerator, args.fuse_max
            )
            diff = max(abs(fused["values"][k] - alone["values"][k]) for k in alone["values"])
            rows.append(
                {
                    "configs": args.configs,
                    "epochs": epochs,
                    "accelerator": args.accelerator,
                    "alone": {k: v for k, v in alone.items() if k != "values"},
                    "fused": {k: v for k, v in fused.items() if k != "values"},
                    "command_ratio": round(fused["command_s"] / alone["command_s"], 3),
                    "sweep_ratio": round(fused["sweep_s"] / alone["sweep_s"], 3),
                    "max_value_difference": diff,
                }
            )
    figures = {"goal_ratio": GOAL_RATIO, "rows": rows}
    publish("fused_sweep", at_start, figures, _show)


def _show(figures: dict[str, Any]) -> None:
    print(f"{'configs':>7} {'epochs':>6} {'alone s':>8} {'fused s':>8} {'ratio':>6} "
          f"{'sweep alone':>11} {'sweep fused':>11} {'ratio':>6} {'max diff':>9}")  # fmt: skip
    for row in figures["rows"]:
        a, f = row["alone"], row["fused"]
        print(
            f"{row['configs']:>7} {row['epochs']:>6} {a['command_s']:>8.2f} "
            f"{f['command_s']:>8.2f} {row['command_ratio']:>6.3f} {a['sweep_s']:>11.2f} "
            f"{f['sweep_s']:>11.2f} {row['sweep_ratio']:>6.3f} {row['max_value_difference']:>9.2e}"
        )


if __name__ == "__main__":
    main()
