"""A sweep of trivial jobs through the real launcher: ``backend=ray`` on a two-node Ray cluster
against ``backend=local``, in the same run, round after round.

Each round makes a fresh launcher per backend (Hydra's own composition, as ``python app.py -m``
does) and hands it every job in one ``launch`` (BasicSweeper's call), 2 slots each:

  local  ``hydra.launcher.backend=local``: 2 CPU slots of this machine, one warm fork server;
  ray    ``hydra.launcher.backend=ray`` with ``ray.address`` a two-node cluster started for
         the run on 127.0.0.1 (``ray start`` nodes of 2 CPUs and 2 declared GPUs each, as the
         tests start them), ``max_workers=2``: 2 slot actors, each with its fork server.

Both record nothing (``mlflow.enabled=false``) and preload nothing (``preload=[]``), so this
is the launcher and its backend alone. Measured: **first job** (the ``launch`` call to the
first task's first line: the backend's start, a slot's start and one job's dispatch) and
**jobs/s** (jobs over first task start to last result; the pool's start-up left out). Ratios
pair the two backends of a round. Run: ``python bench/ray_sweep.py`` (~3 min).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bench.harness import OthersCpu, as_furcate, machine, make_launcher, publish
from tests.ray_cluster import RAY_ENV, ray_cluster

COMMON = [
    "hydra/launcher=furcate",
    "hydra.launcher.preload=[]",
    "hydra.launcher.mlflow.enabled=false",
    "hydra.launcher.progress=plain",
    "hydra.launcher.max_workers=2",
]


def stamp(cfg: DictConfig) -> float:
    """A trivial job: when its task function was entered."""
    return time.time()


def one_sweep(overrides: list[str], jobs: int, sweep_dir: Path) -> dict[str, float]:
    launcher = as_furcate(make_launcher(stamp, [*COMMON, *overrides], sweep_dir))
    began = time.time()
    try:
        returns = launcher.launch([[f"+i={i}"] for i in range(jobs)], 0)
        ended = time.time()
    finally:
        launcher.close()
    starts = [float(r.return_value) for r in returns]
    assert len(starts) == jobs, f"{len(starts)} of {jobs} jobs came back"
    first = min(starts)
    return {
        "first_job_s": round(first - began, 3),
        "jobs_per_s": round(jobs / (ended - first), 2),
        "wall_s": round(ended - began, 2),
    }


def show(figures: dict[str, Any]) -> None:
    print(f"{figures['jobs']} trivial jobs per sweep, 2 slots each, {figures['rounds']} rounds")
    print(f"{'round':<6} {'local first s':>14} {'ray first s':>12} {'local jobs/s':>13} "
          f"{'ray jobs/s':>11} {'first ray/local':>16} {'jobs/s ray/local':>17}")  # fmt: skip
    for i, (local, ray) in enumerate(zip(figures["local"], figures["ray"], strict=True)):
        print(
            f"{i:<6} {local['first_job_s']:>14} {ray['first_job_s']:>12} "
            f"{local['jobs_per_s']:>13} {ray['jobs_per_s']:>11} "
            f"{figures['first_ratio'][i]:>16} {figures['rate_ratio'][i]:>17}"
        )
    print(
        f"medians: first job local {figures['median']['local_first_s']} s, ray "
        f"{figures['median']['ray_first_s']} s ({figures['median']['first_ratio']}x); jobs/s "
        f"local {figures['median']['local_jobs_per_s']}, ray "
        f"{figures['median']['ray_jobs_per_s']} ({figures['median']['rate_ratio']}x)"
    )
    print(f"others' CPU share during the run: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=200, help="trivial jobs per sweep")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    at_start = machine()
    results: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    # The launcher as a driver of the test clusters (see tests/ray_cluster.py): Ray's switch
    # for single-machine Ray, read when Ray is first imported, keeps it on 127.0.0.1.
    os.environ.update(RAY_ENV)
    with ray_cluster(num_gpus=2, worker_nodes=1) as cluster:
        others = OthersCpu()
        own_before = time.process_time()
        ray = ["hydra.launcher.backend=ray", f"hydra.launcher.ray.address={cluster.address}"]
        variants = {"local": ["hydra.launcher.backend=local"], "ray": ray}
        with tempfile.TemporaryDirectory(prefix="furcate-ray-sweep-") as tmp:
            for round_ in range(args.rounds):
                order = ["local", "ray"] if round_ % 2 == 0 else ["ray", "local"]
                for name in order:
                    sweep_dir = Path(tmp) / f"{name}-{round_}"
                    results[name].append(one_sweep(variants[name], args.jobs, sweep_dir))
                    print(f"round {round_} {name}: {results[name][-1]}", flush=True)
        # this process's CPU only: the cluster's processes and the jobs count as others
        share = others.share(time.process_time() - own_before)
    pairs = list(zip(results["local"], results["ray"], strict=True))
    first_ratio = [round(r["first_job_s"] / loc["first_job_s"], 1) for loc, r in pairs]
    rate_ratio = [round(r["jobs_per_s"] / loc["jobs_per_s"], 2) for loc, r in pairs]

    def median(name: str, key: str) -> float:
        return round(statistics.median(x[key] for x in results[name]), 3)

    figures = {
        "jobs": args.jobs,
        "rounds": args.rounds,
        **results,
        "first_ratio": first_ratio,
        "rate_ratio": rate_ratio,
        "median": {
            "local_first_s": median("local", "first_job_s"),
            "ray_first_s": median("ray", "first_job_s"),
            "first_ratio": statistics.median(first_ratio),
            "local_jobs_per_s": median("local", "jobs_per_s"),
            "ray_jobs_per_s": median("ray", "jobs_per_s"),
            "rate_ratio": statistics.median(rate_ratio),
        },
        "others_cpu_share": share,
    }
    publish("ray_sweep", at_start, figures, show)


if __name__ == "__main__":
    main()
