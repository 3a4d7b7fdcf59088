"""What the per-job resource trace costs a sweep: throughput with the trace on and off.

The real launcher in this process (``harness.make_launcher``), 2 CPU slots, nothing preloaded,
every job recorded in a fresh sqlite MLflow store, one ``launch`` of all jobs (Hydra's
BasicSweeper default); the clock runs from the launcher call to the last result, the fork
server and store opened before it. Two workloads:

  trivial  200 jobs that return at once: the launcher's own cost per job is all there is, so
           the trace's bookkeeping (a start and an end per job, the tracer thread waking for
           the jobs it must sample) shows at its largest; most jobs end before their first
           sample.
  sampled  24 jobs that sleep 1.2 s: each is sampled twice at 0.5 s, so every job also costs
           the tracer a trace.csv, a ``log_batch`` of its metrics, its plot and two artifact
           uploads, on the tracer's thread, while the launcher hands out the next jobs.

The trace runs at ``trace_interval_s=0.5`` (20 times the default's rate) against ``0`` (off).
Rounds pair the two, taking turns going first, so a machine that speeds up or slows down during
a round favours neither; the result is the median over rounds of on ÷ off. Others' CPU share
(``harness.OthersCpu``) says how busy the machine was with other work meanwhile.

Run: ``python bench/trace_cost.py`` (~4 min: 4 rounds) writes bench/results/trace_cost.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
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

SLOTS = 2
TRACE_ON = "hydra.launcher.trace_interval_s=0.5"
TRACE_OFF = "hydra.launcher.trace_interval_s=0"
LAUNCHER_OVERRIDES = [
    "hydra/launcher=furcate",
    f"hydra.launcher.max_workers={SLOTS}",
    "hydra.launcher.preload=[]",
    "hydra.launcher.progress=off",
]
# name: (jobs, seconds each job sleeps)
WORKLOADS = {"trivial": (200, 0.0), "sampled": (24, 1.2)}


def task(cfg: DictConfig) -> int:
    """The benchmark's job: sleep as long as its workload says, return its number."""
    if cfg.sleep:
        time.sleep(float(cfg.sleep))
    return int(cfg.x)


def run_variant(workload: str, trace: bool) -> dict[str, Any]:
    """One fresh launcher and store, warm before the clock starts."""
    count, sleep = WORKLOADS[workload]
    load, probe = round(os.getloadavg()[0], 2), speed_probe()
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        store = f"hydra.launcher.mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db"
        overrides = [*LAUNCHER_OVERRIDES, store, TRACE_ON if trace else TRACE_OFF]
        sweep = Path(tmp) / "sweep"
        launcher = as_furcate(make_launcher(task, overrides, sweep))
        try:
            session = launcher.session()  # the fork server and the store, before the clock
            me = psutil.Process()
            server = psutil.Process(local_pool(session).server_pid)
            own_cpu, server_cpu = _cpu(me), _cpu(server)
            others = OthersCpu()
            began = time.perf_counter()
            returns = launcher.launch([[f"+x={i}", f"+sleep={sleep}"] for i in range(count)], 0)
            wall = time.perf_counter() - began
            own_cpu, server_cpu = _cpu(me) - own_cpu, _cpu(server) - server_cpu
            tracer = session.tracer
            tracer_cpu = _thread_cpu(me, tracer.thread_id if tracer is not None else None)
            others_share = others.share(own_cpu + server_cpu)
            for job_return in returns:
                task_value(job_return)
            closing = time.perf_counter()
        finally:
            launcher.close()
        close_s = time.perf_counter() - closing
        traced = [JobPaths.of(sweep / str(i)) for i in range(count)]
        traces = sum(paths.trace.exists() for paths in traced)
        plots = sum(paths.trace_plot.exists() for paths in traced)
    return {
        "workload": workload,
        "trace": trace,
        "jobs": count,
        "sleep_s": sleep,
        "loadavg_1m_at_start": load,
        "speed_probe": probe,
        "others_cpu_share": others_share,
        "wall_s": round(wall, 3),
        "jobs_per_s": round(count / wall, 2),
        "launcher_cpu_ms_per_job": round(own_cpu * 1000 / count, 2),
        "tracer_thread_cpu_ms_per_job": None
        if tracer_cpu is None
        else round(tracer_cpu * 1000 / count, 2),
        "fork_server_and_jobs_cpu_ms_per_job": round(server_cpu * 1000 / count, 2),
        "jobs_with_trace_csv": traces,
        "jobs_with_plot": plots,
        "close_s": round(close_s, 3),
    }


def _cpu(process: psutil.Process) -> float:
    """CPU seconds of a process and the children it waited for."""
    times = process.cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)


def _thread_cpu(process: psutil.Process, tid: int | None) -> float | None:
    for thread in process.threads() if tid is not None else []:
        if thread.id == tid:
            return float(thread.user_time + thread.system_time)
    return None


def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for workload in WORKLOADS:
            for trace in (True, False) if round_ % 2 == 0 else (False, True):
                run = run_variant(workload, trace)
                run["round"] = round_
                print(
                    f"round {round_} {workload:<7} trace {'on ' if trace else 'off'}: "
                    f"{run['jobs_per_s']:6.2f} jobs/s, launcher CPU "
                    f"{run['launcher_cpu_ms_per_job']:.1f} ms/job (tracer thread "
                    f"{run['tracer_thread_cpu_ms_per_job']}), traces {run['jobs_with_trace_csv']}, "
                    f"plots {run['jobs_with_plot']} (load {run['loadavg_1m_at_start']}, "
                    f"others' CPU {run['others_cpu_share']:.0%})"
                )
                runs.append(run)
    return {"slots": SLOTS, "summary": summary(runs), "runs": runs}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload: medians of jobs/s on and off, and of the ratio paired within a round."""
    result: dict[str, Any] = {}
    for workload in WORKLOADS:
        mine = [run for run in runs if run["workload"] == workload]
        on = {run["round"]: run for run in mine if run["trace"]}
        off = {run["round"]: run for run in mine if not run["trace"]}
        ratios = [on[r]["jobs_per_s"] / off[r]["jobs_per_s"] for r in sorted(on)]
        result[workload] = {
            "median_jobs_per_s_on": statistics.median(run["jobs_per_s"] for run in on.values()),
            "median_jobs_per_s_off": statistics.median(run["jobs_per_s"] for run in off.values()),
            "ratio_on_off_per_round": [round(ratio, 3) for ratio in ratios],
            "median_ratio_on_off": round(statistics.median(ratios), 3),
            "median_launcher_cpu_ms_per_job_on": statistics.median(
                run["launcher_cpu_ms_per_job"] for run in on.values()
            ),
            "median_launcher_cpu_ms_per_job_off": statistics.median(
                run["launcher_cpu_ms_per_job"] for run in off.values()
            ),
            "median_tracer_thread_cpu_ms_per_job": statistics.median(
                run["tracer_thread_cpu_ms_per_job"] or 0.0 for run in on.values()
            ),
            "median_others_cpu_share": statistics.median(run["others_cpu_share"] for run in mine),
        }
    return result


def show(figures: dict[str, Any]) -> None:
    for workload, row in figures["summary"].items():
        print(
            f"{workload:<7} on {row['median_jobs_per_s_on']:.2f} jobs/s, off "
            f"{row['median_jobs_per_s_off']:.2f}: on/off {row['median_ratio_on_off']} "
            f"(rounds {row['ratio_on_off_per_round']}); launcher CPU "
            f"{row['median_launcher_cpu_ms_per_job_on']} vs "
            f"{row['median_launcher_cpu_ms_per_job_off']} ms/job, tracer thread "
            f"{row['median_tracer_thread_cpu_ms_per_job']} ms/job; others' CPU "
            f"{row['median_others_cpu_share']:.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4, help="paired rounds of on and off")
    args = parser.parse_args()
    at_start = machine()
    publish("trace_cost", at_start, bench(args), show)


if __name__ == "__main__":
    main()
