"""What the per-job resource trace costs a sweep: throughput with the trace on and off.

Two real launchers in this process (``harness.make_launcher``), one with
``trace_interval_s=0.5`` (20 times the default's rate), one with ``0`` (off); each has 2 CPU
slots, nothing preloaded, its own fresh sqlite MLflow store (every job recorded), its fork
server and store opened before the clock. They take turns: a block of jobs through one
launcher's ``launch`` (Hydra's BasicSweeper path), then a block through the other, in the order
on-off, off-on, ...; so other work on the machine, which comes and goes within seconds here,
falls on both alike. Two workloads:

  trivial  jobs that return at once (blocks of 50, 200 per launcher per round): the launcher's
           own cost per job is all there is, so the trace's bookkeeping (a start and an end per
           job, its thread waking) shows at its largest; most jobs end before their first sample.
  sampled  jobs that sleep 1.2 s (blocks of 8, 24 per launcher per round): each is sampled
           twice, so every job also costs the tracer a trace.csv, a ``log_batch`` of its
           metrics, its plot and the upload of both files, on the tracer's thread, while the
           launcher hands out the next jobs.

Per round and workload: jobs/s of each launcher over its blocks and their ratio (on ÷ off); the
result is the median over rounds. CPU per job: the launcher's main thread, the tracer's thread,
the fork server and jobs; others' CPU share (``harness.OthersCpu``) says how busy the machine
was with other work meanwhile.

``--aa`` runs the same with neither launcher tracing (an A/A comparison): how far the ratio
strays when there is nothing to find, on this machine at that time.

Run: ``python bench/trace_cost.py`` (~7 min: 4 rounds) writes bench/results/trace_cost.json;
``python bench/trace_cost.py --aa --workloads trivial`` (~3 min) trace_cost_aa.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from omegaconf import DictConfig

from bench.harness import (
    OthersCpu,
    as_furcate,
    local_pool,
    machine,
    make_launcher,
    publish,
    speed_probe,
    task_value,
)
from furcate_hydra.layout import JobPaths
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

SLOTS = 2
ON_S = 0.5
LAUNCHER_OVERRIDES = [
    "hydra/launcher=furcate",
    f"hydra.launcher.max_workers={SLOTS}",
    "hydra.launcher.preload=[]",
    "hydra.launcher.progress=off",
]
# name: (jobs per block, blocks per launcher per round, seconds each job sleeps)
WORKLOADS = {"trivial": (50, 4, 0.0), "sampled": (8, 3, 1.2)}


def task(cfg: DictConfig) -> int:
    """The benchmark's job: sleep as long as its workload says, return its number."""
    if cfg.sleep:
        time.sleep(float(cfg.sleep))
    return int(cfg.x)


@dataclass
class Variant:
    """One launcher of a round and what its blocks took."""

    trace: bool
    launcher: FurcateLauncher
    sweep: Path
    jobs: int = 0
    wall_s: float = 0.0
    main_cpu_s: float = 0.0
    tracer_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    others: list[float] = field(default_factory=list)


def run_round(workload: str, aa: bool = False) -> dict[str, Any]:
    """Fresh launchers (trace on and off), warm, then their blocks in turns. ``aa``: the
    "on" launcher traces nothing either, which shows how far two equal launchers differ."""
    size, blocks, sleep = WORKLOADS[workload]
    load, probe = round(os.getloadavg()[0], 2), speed_probe()
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        variants = [_variant(Path(tmp), trace, aa) for trace in (True, False)]
        try:
            next_x = 0
            for block in range(2 * blocks):
                # on, off, off, on, on, off, ...: neither always goes first
                variant = variants[(block + block // 2) % 2]
                _run_block(variant, [[f"+x={next_x + i}", f"+sleep={sleep}"] for i in range(size)])
                next_x += size
        finally:
            for variant in variants:
                variant.launcher.close()
        counted = [_files(v.sweep, v.jobs) for v in variants]
    row: dict[str, Any] = {"workload": workload, "loadavg_1m_at_start": load, "speed_probe": probe}
    for variant, (traces, plots) in zip(variants, counted, strict=True):
        row["on" if variant.trace else "off"] = {
            "jobs": variant.jobs,
            "wall_s": round(variant.wall_s, 3),
            "jobs_per_s": round(variant.jobs / variant.wall_s, 2),
            "main_thread_cpu_ms_per_job": _ms(variant.main_cpu_s, variant.jobs),
            "tracer_thread_cpu_ms_per_job": _ms(variant.tracer_cpu_s, variant.jobs),
            "fork_server_and_jobs_cpu_ms_per_job": _ms(variant.server_cpu_s, variant.jobs),
            "others_cpu_share": round(statistics.mean(variant.others), 3),
            "jobs_with_trace_csv": traces,
            "jobs_with_plot": plots,
        }
    row["ratio_on_off"] = round(row["on"]["jobs_per_s"] / row["off"]["jobs_per_s"], 3)
    return row


def _variant(tmp: Path, trace: bool, aa: bool) -> Variant:
    name = "on" if trace else "off"
    overrides = [
        *LAUNCHER_OVERRIDES,
        f"hydra.launcher.mlflow.tracking_uri=sqlite:///{tmp}/mlflow-{name}.db",
        f"hydra.launcher.trace_interval_s={ON_S if trace and not aa else 0}",
    ]
    sweep = tmp / name
    launcher = as_furcate(make_launcher(task, overrides, sweep))
    launcher.session()  # the fork server and the store, before the clock
    return Variant(trace, launcher, sweep)


def _run_block(variant: Variant, overrides: list[list[str]]) -> None:
    session = variant.launcher.session()
    me, server = psutil.Process(), psutil.Process(local_pool(session).server_pid)
    tracer = session.tracer
    tracer_id = tracer.thread_id if tracer is not None else None
    process_cpu, server_cpu = _cpu(me), _cpu(server)
    tracer_cpu, main_cpu = _thread_cpu(me, tracer_id), time.thread_time()
    others = OthersCpu()
    began = time.perf_counter()
    returns = variant.launcher.launch(overrides, variant.jobs)
    variant.wall_s += time.perf_counter() - began
    variant.main_cpu_s += time.thread_time() - main_cpu
    variant.tracer_cpu_s += _thread_cpu(me, tracer_id) - tracer_cpu
    server_cpu = _cpu(server) - server_cpu
    variant.server_cpu_s += server_cpu
    variant.others.append(others.share(_cpu(me) - process_cpu + server_cpu))
    variant.jobs += len(returns)
    for job_return in returns:
        task_value(job_return)


def _files(sweep: Path, count: int) -> tuple[int, int]:
    """Job dirs with a trace.csv, and with its plot."""
    paths = [JobPaths.of(sweep / str(num)) for num in range(count)]
    return sum(p.trace.exists() for p in paths), sum(p.trace_plot.exists() for p in paths)


def _cpu(process: psutil.Process) -> float:
    """CPU seconds of a process and the children it waited for."""
    times = process.cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)


def _thread_cpu(process: psutil.Process, tid: int | None) -> float:
    with contextlib.suppress(psutil.Error):
        for thread in process.threads() if tid is not None else []:
            if thread.id == tid:
                return float(thread.user_time + thread.system_time)
    return 0.0


def _ms(seconds: float, jobs: int) -> float:
    return round(seconds * 1000 / max(jobs, 1), 2)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for workload in args.workloads:
            row = run_round(workload, args.aa)
            row["round"] = round_
            on, off = row["on"], row["off"]
            print(
                f"round {round_} {workload:<7} on {on['jobs_per_s']:6.2f} jobs/s, off "
                f"{off['jobs_per_s']:6.2f}: {row['ratio_on_off']:.3f}; main thread "
                f"{on['main_thread_cpu_ms_per_job']} vs {off['main_thread_cpu_ms_per_job']} "
                f"ms/job, tracer {on['tracer_thread_cpu_ms_per_job']} ms/job; traces "
                f"{on['jobs_with_trace_csv']}, plots {on['jobs_with_plot']} (others' CPU "
                f"{on['others_cpu_share']:.0%} / {off['others_cpu_share']:.0%})"
            )
            rounds.append(row)
    return {
        "slots": SLOTS,
        "trace_interval_s_on": 0 if args.aa else ON_S,
        "summary": summary(rounds, args.workloads),
        "rounds": rounds,
    }


def summary(rounds: list[dict[str, Any]], workloads: list[str]) -> dict[str, Any]:
    """Per workload, medians over rounds."""
    result: dict[str, Any] = {}
    for workload in workloads:
        mine = [row for row in rounds if row["workload"] == workload]

        def median(side: str, key: str, rows: list[dict[str, Any]] = mine) -> float:
            return round(float(statistics.median(row[side][key] for row in rows)), 3)

        result[workload] = {
            "ratio_on_off_per_round": [row["ratio_on_off"] for row in mine],
            "median_ratio_on_off": statistics.median(row["ratio_on_off"] for row in mine),
            "median_jobs_per_s_on": median("on", "jobs_per_s"),
            "median_jobs_per_s_off": median("off", "jobs_per_s"),
            "median_main_thread_cpu_ms_per_job_on": median("on", "main_thread_cpu_ms_per_job"),
            "median_main_thread_cpu_ms_per_job_off": median("off", "main_thread_cpu_ms_per_job"),
            "median_tracer_thread_cpu_ms_per_job": median("on", "tracer_thread_cpu_ms_per_job"),
            "median_others_cpu_share_on": median("on", "others_cpu_share"),
            "median_others_cpu_share_off": median("off", "others_cpu_share"),
        }
    return result


def show(figures: dict[str, Any]) -> None:
    for workload, row in figures["summary"].items():
        print(
            f"{workload:<7} on {row['median_jobs_per_s_on']} jobs/s, off "
            f"{row['median_jobs_per_s_off']}: on/off {row['median_ratio_on_off']} (rounds "
            f"{row['ratio_on_off_per_round']}); main thread "
            f"{row['median_main_thread_cpu_ms_per_job_on']} vs "
            f"{row['median_main_thread_cpu_ms_per_job_off']} ms/job, tracer thread "
            f"{row['median_tracer_thread_cpu_ms_per_job']} ms/job; others' CPU "
            f"{row['median_others_cpu_share_on']:.0%} / {row['median_others_cpu_share_off']:.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of both workloads")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument(
        "--aa", action="store_true", help="both launchers untraced: the noise of the comparison"
    )
    args = parser.parse_args()
    at_start = machine()
    publish("trace_cost_aa" if args.aa else "trace_cost", at_start, bench(args), show)


if __name__ == "__main__":
    main()
