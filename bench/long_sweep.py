"""One long sweep of trivial jobs (100,000 by default): does the launcher stay as lean and as
fast at its end as at its start, and can the sweep be read while it runs?

One real ``python bench/apps/trivial_app.py -m 'i=range(0,N)' hydra/sweeper=furcate`` in a
temp dir, with a fresh MLflow sqlite store there (given furcate's tags index by the launcher,
as every sqlite store is by default), 2 CPU slots on this machine, each job recorded. The
launcher's RSS is sampled every 0.25 s by a Hydra callback (``bench/memory_probe.py``); while
it runs, ``furcate status <sweep dir> --json`` is run every ``--status-every-s`` seconds.

Figures:
  memory   the launcher's RSS when the ``--at``-th job (10,000) ended and when the last one
           did, their ratio (goal ≤ 1.1) and the growth per job between them;
  pace     jobs/s over the whole run and in each tenth of the jobs (by end time); the last
           tenth over the first (goal: ≥ 0.9);
  files    seconds from the last job's end to the sweep's end (run_data.csv, summary.md and
           the sweep's run written in it), and their sizes;
  status   each ``furcate status`` while it ran: seconds, the jobs it counted, its exit status;
  others   the share of the machine's CPU that other work used meanwhile, over the whole run
           and in each tenth (other work in one tenth alone moves that tenth's pace);
  planning seconds from the multirun's start to its first job (the grid composed and checked).

Run: ``python bench/long_sweep.py`` (~90 min on 2 cores); ``--jobs 12000 --at 2000`` for a
quick look at the trend (~10 min).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import psutil

from bench.commands import app_command, empty_store, run_command
from bench.harness import machine, machine_busy_seconds, publish
from bench.launcher_memory import APP, COMMON, sweep_env


class Every:
    """``tick()`` every ``every_s`` seconds on a thread of its own, inside a ``with``."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def tick(self) -> None:
        raise NotImplementedError


class StatusWatch(Every):
    """``furcate status --json`` of the sweep dir, timed, while the sweep runs (once its dir
    exists)."""

    def __init__(self, sweep_dir: Path, env: dict[str, str], every_s: float) -> None:
        super().__init__(every_s)
        self.sweep_dir, self.env = sweep_dir, env
        self.readings: list[dict[str, Any]] = []

    def tick(self) -> None:
        if (self.sweep_dir / "furcate_sweep.json").exists():
            self.readings.append(self.read())

    def read(self) -> dict[str, Any]:
        command = [sys.executable, "-m", "furcate_hydra.cli", "status", str(self.sweep_dir)]
        done = run_command([*command, "--json"], env=self.env, timeout_s=600)
        counts: dict[str, int] = {}
        if done.returncode == 0:
            counts = json.loads(done.stdout).get("counts", {})
        return {
            "at": round(done.ended, 1),
            "seconds": round(done.wall_s, 2),
            "exit": done.returncode,
            "counts": counts,
            "error": done.stderr[-500:] if done.returncode else "",
        }


class CpuWatch(Every):
    """The machine's busy CPU seconds and those of the sweep's process tree (the launcher, its
    fork server and the jobs it reaped), to tell other work's share of any stretch of the run."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__(every_s)
        self.samples: list[tuple[float, float, float]] = []
        self.root: psutil.Process | None = None

    def watch_tree(self, pid: int) -> None:
        """Count the process ``pid`` and its descendants as the sweep's own."""
        self.root = psutil.Process(pid)

    def tick(self) -> None:
        if self.root is not None:
            self.samples.append((time.time(), machine_busy_seconds(), self._tree_cpu_s()))

    def _tree_cpu_s(self) -> float:
        assert self.root is not None
        total = 0.0
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return self.samples[-1][2] if self.samples else 0.0
        for process in processes:
            try:
                t = process.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
        return total

    def others_share(self, start: float, end: float) -> float | None:
        """Other work's share of the machine's CPU between two times (None: too short)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = inside[0], inside[-1]
        others = max(0.0, (busy1 - busy0) - (own1 - own0))
        return round(others / ((t1 - t0) * (os.cpu_count() or 1)), 3)


def run_long_sweep(jobs: int, at: int, status_every_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="furcate-long-sweep-") as tmp:
        work = Path(tmp)
        store = empty_store(work / "mlflow.db")
        report, sweep = work / "memory.json", work / "sweep"
        overrides = [
            f"i=range(0,{jobs})",
            f"hydra.sweep.dir={sweep}",
            "hydra/sweeper=furcate",
            *COMMON,
            f"+hydra.callbacks.memory_probe.out={report}",
        ]
        env = sweep_env(store)
        with StatusWatch(sweep, env, status_every_s) as watch, CpuWatch() as cpu:
            done = run_command(
                app_command(APP, overrides), cwd=work, env=env, on_start=cpu.watch_tree
            )
        if done.returncode != 0 or not report.exists():
            raise RuntimeError(f"N={jobs} failed ({done.returncode}):\n{done.stderr[-5000:]}")
        probe = json.loads(report.read_text())
        starts, ends = job_times(sweep / "run_data.csv")
        figures = {
            "jobs": jobs,
            "wall_s": round(done.ended - done.began, 1),
            "planning_s": round(starts[0] - probe["began_wall"], 1),
            "memory": memory_at(probe, ends, at),
            "pace": pace(ends, cpu),
            "files": closing(probe, ends, sweep),
            "status": watch.readings,
            "store_mib": round(store.stat().st_size / 2**20, 1),
            "others_cpu_share": done.others_cpu_share,
        }
    return figures


def job_times(run_data_csv: Path) -> tuple[list[float], list[float]]:
    """Every job's start and end, each sorted."""
    with run_data_csv.open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["end"]]
    return sorted(float(r["start"]) for r in rows), sorted(float(r["end"]) for r in rows)


def memory_at(probe: dict[str, Any], ends: list[float], at: int) -> dict[str, Any]:
    """RSS when the ``at``-th job ended and when the last one did (the probe's samples are
    seconds after the multirun's start, ``began_wall``)."""

    def rss_kib(wall: float) -> int:
        offset = wall - probe["began_wall"]
        kib = probe["samples"][0][1]
        for t, sample in probe["samples"]:
            if t > offset:
                break
            kib = sample
        return int(kib)

    early, late = rss_kib(ends[at - 1]), rss_kib(ends[-1])
    return {
        "at_jobs": at,
        "rss_at_kib": early,
        "rss_last_job_kib": late,
        "rss_end_kib": probe["rss_end_kib"],
        "rss_peak_kib": probe["rss_peak_kib"],
        "ratio": round(late / early, 3),
        "kib_per_job": round((late - early) / (len(ends) - at), 3),
    }


def pace(ends: list[float], cpu: CpuWatch) -> dict[str, Any]:
    """Jobs/s over the run and in each tenth of the jobs by end time, with other work's share
    of the CPU in each tenth."""
    tenth = len(ends) // 10
    spans = [(ends[k * tenth], ends[(k + 1) * tenth - 1]) for k in range(10)]
    tenths = [round((tenth - 1) / (end - start), 2) for start, end in spans]
    return {
        "jobs_per_s": round((len(ends) - 1) / (ends[-1] - ends[0]), 2),
        "tenths_jobs_per_s": tenths,
        "tenths_others_cpu_share": [cpu.others_share(start, end) for start, end in spans],
        "last_over_first": round(tenths[-1] / tenths[0], 3),
    }


def closing(probe: dict[str, Any], ends: list[float], sweep: Path) -> dict[str, Any]:
    """From the last job's end to the sweep's end, and what the sweep dir holds then."""
    summary = sweep / "summary.md"
    return {
        "last_job_to_end_s": round(probe["ended_wall"] - ends[-1], 2),
        "run_data_csv_mib": round((sweep / "run_data.csv").stat().st_size / 2**20, 2),
        "summary_md_kib": round(summary.stat().st_size / 1024, 1) if summary.exists() else None,
    }


def show(figures: dict[str, Any]) -> None:
    memory, pace_, files = figures["memory"], figures["pace"], figures["files"]
    print(
        f"{figures['jobs']} jobs in {figures['wall_s']} s (first job after "
        f"{figures['planning_s']} s), store {figures['store_mib']} MiB"
    )
    print(
        f"RSS at job {memory['at_jobs']}: {memory['rss_at_kib'] / 1024:.1f} MiB, at the last: "
        f"{memory['rss_last_job_kib'] / 1024:.1f} MiB = {memory['ratio']} x "
        f"({memory['kib_per_job']} KiB per job); peak {memory['rss_peak_kib'] / 1024:.1f} MiB"
    )
    print(
        f"jobs/s {pace_['jobs_per_s']}; per tenth {pace_['tenths_jobs_per_s']}; last/first "
        f"{pace_['last_over_first']}; others' CPU per tenth {pace_['tenths_others_cpu_share']}"
    )
    print(
        f"last job to the sweep's end {files['last_job_to_end_s']} s; run_data.csv "
        f"{files['run_data_csv_mib']} MiB; summary.md {files['summary_md_kib']} KiB"
    )
    for reading in figures["status"]:
        done = reading["counts"].get("FINISHED", 0)
        print(f"  status: {reading['seconds']:6.2f} s, exit {reading['exit']}, {done} finished")
    print(f"others' CPU share: {figures['others_cpu_share']}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--at", type=int, default=10_000, help="the job to compare memory at")
    parser.add_argument("--status-every-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if not 0 < args.at < args.jobs:
        parser.error(f"--at must be between 0 and --jobs ({args.jobs}), got {args.at}")
    at_start = machine()
    publish("long_sweep", at_start, run_long_sweep(args.jobs, args.at, args.status_every_s), show)


if __name__ == "__main__":
    main()
