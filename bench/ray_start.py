"""Job start on Ray: a job forked by a warm slot actor against a plain Ray task with a fresh
worker per task (``max_calls=1``), in the same run on the same local Ray instance.

Variants, jobs one after another (the next only after the last ended), each asking for half
of a declared GPU, as ``hydra.launcher.jobs_per_gpu=2`` does:

  actor fork   ``SlotActor.run`` (what ``hydra.launcher.backend=ray`` uses): the actor's warm
               fork server, which imported ``--preload`` once, forks a fresh process per job;
  plain task   ``@ray.remote(max_calls=1)``: Ray starts a fresh worker for every task, which
               imports ``--preload`` before the job's code can run (the fresh process the
               backend promises, paid for the Ray way).

The clock starts just before the ``.remote()`` call and stops at the job's first line (after
its imports): what a user waits for before their code runs. The actor's own start (once per
slot, importing ``--preload``) is reported apart. Run: ``python bench/ray_start.py``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cloudpickle

from bench.harness import OthersCpu, machine, publish, summarize
from furcate_hydra.execution.forkserver.protocol import ChildReport, Placement, Start


class StampContext:
    """The warm context of the bench's fork server: a job returns when it began to run."""

    def prepare(self) -> None:
        pass

    def run(self, payload: bytes) -> float:
        return time.time()


def stamp_after_imports(preload: list[str]) -> float:
    """A plain task's body: import what the job needs, then note the time."""
    for name in preload:
        importlib.import_module(name)
    return time.time()


def bench_actor(ray: Any, jobs: int, preload: list[str], tmp: Path) -> dict[str, Any]:
    from furcate_hydra.ray_backend.slot_actor import SlotActor

    actor_class = ray.remote(SlotActor).options(num_gpus=0.5, num_cpus=0, max_concurrency=4)
    began = time.perf_counter()
    actor = actor_class.remote(
        0, preload, bytes(cloudpickle.dumps(StampContext())), os.getcwd(), list(sys.path), 0.5
    )
    info = ray.get(actor.where.remote())
    actor_start_s = time.perf_counter() - began
    seconds = []
    for i in range(jobs):
        start = Start(
            key=str(i),
            payload=b"",
            env={},
            placement=Placement(0, {}, None, None),
            stdout_path=str(tmp / f"{i}.out"),
            stderr_path=str(tmp / f"{i}.err"),
            result_path="",
            echo=False,
        )
        t0 = time.time()
        result = ray.get(actor.run.remote(start))
        report = cloudpickle.loads(result.report)
        if not isinstance(report, ChildReport) or report.error is not None:
            raise RuntimeError(f"a benchmark job failed: {report!r}")
        seconds.append(report.value - t0)
    ray.get(actor.shutdown.remote(1.0))
    ray.kill(actor)
    return {
        "to_job": summarize(seconds),
        "actor_start_s": round(actor_start_s, 2),
        "server_start_s": round(info.server_start_s, 2),
        "cuda_visible_devices": info.cuda_visible_devices,
    }


def bench_task(ray: Any, jobs: int, preload: list[str]) -> dict[str, Any]:
    task = ray.remote(max_calls=1, num_gpus=0.5, num_cpus=0)(stamp_after_imports)
    seconds = []
    for _ in range(jobs):
        t0 = time.time()
        seconds.append(ray.get(task.remote(preload)) - t0)
    return {"to_job": summarize(seconds)}


def show(figures: dict[str, Any]) -> None:
    actor, task = figures["actor_fork"], figures["plain_task"]
    print(f"preload {figures['preload']}, {figures['jobs']} jobs each, one after another")
    print(f"{'variant':<12} {'median ms':>10} {'p90 ms':>10} {'min ms':>10} {'max ms':>10}")
    for name, data in (("actor fork", actor), ("plain task", task)):
        t = data["to_job"]
        print(
            f"{name:<12} {t['median_ms']:>10} {t['p90_ms']:>10} {t['min_ms']:>10} {t['max_ms']:>10}"
        )
    print(
        f"actor start (once per slot): {actor['actor_start_s']} s, of which fork server "
        f"{actor['server_start_s']} s"
    )
    print(f"ratio plain task / actor fork (medians): {figures['ratio']}x")
    print(f"others' CPU share during the run: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=10, help="jobs per variant")
    parser.add_argument(
        "--preload", default="torch", help="comma-separated modules a job needs ('' for none)"
    )
    args = parser.parse_args()
    preload = [name for name in args.preload.split(",") if name]
    # This machine only, on loopback: Ray's switch for single-machine Ray, read when Ray is
    # imported (else the node takes the machine's network address, and its processes talk
    # over it).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    at_start = machine()
    others = OthersCpu()
    own_before = time.process_time()
    # A Ray instance of this process, 2 CPUs and 2 declared GPUs (no hardware needed).
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
            actor = bench_actor(ray, args.jobs, preload, Path(tmp))
            task = bench_task(ray, args.jobs, preload)
    finally:
        ray.shutdown()
    figures = {
        "jobs": args.jobs,
        "preload": preload,
        "actor_fork": actor,
        "plain_task": task,
        "ratio": round(task["to_job"]["median_ms"] / actor["to_job"]["median_ms"], 1),
        # the launcher's own CPU only: Ray's processes count as others' here
        "others_cpu_share": others.share(time.process_time() - own_before),
    }
    publish("ray_start", at_start, figures, show)


if __name__ == "__main__":
    main()
