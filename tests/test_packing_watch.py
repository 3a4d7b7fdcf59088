"""What jobs_per_gpu=auto reads twice a second: each job's GPU memory by its session's
processes (or the GPU's used memory where NVML's pids are of another namespace), and each
GPU's rate from its jobs' progress files, or its utilisation where they write none.

The jobs are real processes (each leads its own session, as the pool's jobs do); NVML's
answers are given as a real driver gives them (pids and bytes), and the clock is the test's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from furcate_hydra.execution.gpu.packing import GIB, SOURCE_DEVICE, SOURCE_PROCESS, GpuPacking
from furcate_hydra.execution.slots import GpuStart
from furcate_hydra.progress import write_progress
from furcate_hydra.tracing.gpu import DeviceReading
from furcate_hydra.tracing.packing_watch import (
    NO_RATE_AFTER_S,
    STEPS,
    UTIL_SETTLE_S,
    UTILISATION,
    PackingWatch,
)

TOTAL = 80 * GIB
BEFORE = 2 * GIB  # in use on the GPU before the sweep (another user's process)


class Recorder(GpuPacking):
    """The real packing, with what it was told kept for the test to read."""

    def __init__(self) -> None:
        super().__init__({"0": GpuStart(1, TOTAL - BEFORE)}, {"0": 8}, 0)
        self.samples: list[tuple[str, int, str]] = []
        self.rates: list[tuple[int, float, str]] = []
        self.unrated_gpus: list[str] = []

    def sample(self, key: str, held_bytes: int, source: str, at: float | None = None) -> None:
        self.samples.append((key, held_bytes, source))
        super().sample(key, held_bytes, source, at)

    def rate(self, device: str, jobs: int, value: float, unit: str) -> None:
        self.rates.append((jobs, value, unit))
        super().rate(device, jobs, value, unit)

    def unrated(self, device: str) -> None:
        self.unrated_gpus.append(device)
        super().unrated(device)


class Reader:
    """NVML's answer for GPU 0, as the test sets it."""

    def __init__(self) -> None:
        self.processes: list[tuple[int, int]] = []
        self.util: float | None = 40.0

    def device(self, device: str) -> DeviceReading | None:
        used = BEFORE + sum(size for _, size in self.processes)
        return DeviceReading(tuple(self.processes), used, TOTAL, self.util)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def job() -> Iterator[tuple[int, int]]:
    """A job's process (its session's leader) and a worker it started: (leader, worker)."""
    code = (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    worker = int(leader.stdout.readline())
    try:
        yield leader.pid, worker
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def watch_of(packing: Recorder, reader: Reader, clock: Clock) -> PackingWatch:
    return PackingWatch(packing, packing.budgets(), reader, clock=clock, thread=False)


def test_a_job_s_memory_is_what_the_processes_of_its_session_hold(
    job: tuple[int, int], tmp_path: Path
) -> None:
    leader, worker = job
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    packing.started("a", "0")
    watch.start("a", leader, "0", tmp_path / "progress.json")
    reader.processes = [(leader, GIB), (worker, GIB // 2), (1, 5 * GIB)]  # pid 1: not its
    watch.tick()
    assert packing.samples == [("a", GIB + GIB // 2, SOURCE_PROCESS)]


def test_where_no_pid_matches_the_gpu_s_used_memory_is_shared_by_its_jobs(
    tmp_path: Path,
) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    for key, pid in (("a", 4_000_001), ("b", 4_000_002)):  # no such processes here
        packing.started(key, "0")
        watch.start(key, pid, "0", tmp_path / f"{key}.json")
    reader.processes = [(17, 3 * GIB), (18, 3 * GIB)]  # the host's pids, not the jobs'
    watch.tick()
    # what is used above the 2 GiB in use before the sweep, halved
    assert sorted(packing.samples) == [("a", 3 * GIB, SOURCE_DEVICE), ("b", 3 * GIB, SOURCE_DEVICE)]


def test_steps_per_second_come_from_a_job_s_last_two_progress_reports(
    tmp_path: Path,
) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    progress = tmp_path / "progress.json"
    packing.started("a", "0")
    watch.start("a", 4_000_001, "0", progress)
    for step in (10, 30, 50):
        clock.now += 1.0
        write_progress(progress, 0, step, {}, at=clock.now)
        watch.tick()
    # from the second report on, 20 steps in 1 s; utilisation is no longer read
    assert packing.rates == [(1, 20.0, STEPS), (1, 20.0, STEPS)]


def test_the_rate_is_of_the_jobs_training_now_not_of_those_starting_or_stalled(
    tmp_path: Path,
) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    for key in "abc":
        packing.started(key, "0")
        watch.start(key, 4_000_000 + ord(key), "0", tmp_path / f"{key}.json")
    write_progress(tmp_path / "c.json", 0, 5, {}, at=clock.now)  # c stalls after this one
    for step in (10, 20, 30):  # a trains at 10 steps/s, b is still starting
        clock.now += 1.0
        write_progress(tmp_path / "a.json", 0, step, {}, at=clock.now)
        watch.tick()
    assert packing.rates == [(1, 10.0, STEPS), (1, 10.0, STEPS)]


def test_progress_from_before_a_job_started_is_not_its_own(tmp_path: Path) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    progress = tmp_path / "progress.json"
    write_progress(progress, 3, 500, {}, at=clock.now - 100)  # an earlier attempt's
    packing.started("a", "0")
    watch.start("a", 4_000_001, "0", progress)
    clock.now += UTIL_SETTLE_S
    watch.tick()
    assert packing.rates == [(1, 40.0, UTILISATION)]


def test_utilisation_counts_once_the_jobs_and_their_count_settled(tmp_path: Path) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    watch = watch_of(packing, reader, clock)
    packing.started("a", "0")
    watch.start("a", 4_000_001, "0", tmp_path / "a.json")
    clock.now += UTIL_SETTLE_S
    watch.tick()
    packing.started("b", "0")
    watch.start("b", 4_000_002, "0", tmp_path / "b.json")
    clock.now += UTIL_SETTLE_S / 2
    watch.tick()  # b just started: it holds a context but runs no kernel yet
    clock.now += UTIL_SETTLE_S / 2
    reader.util = 75.0
    watch.tick()
    assert packing.rates == [(1, 40.0, UTILISATION), (2, 75.0, UTILISATION)]


def test_a_gpu_with_no_utilisation_and_no_progress_is_packed_by_memory_alone(
    tmp_path: Path,
) -> None:
    packing, reader, clock = Recorder(), Reader(), Clock()
    reader.util = None  # e.g. a MIG instance
    watch = watch_of(packing, reader, clock)
    packing.started("a", "0")
    watch.start("a", 4_000_001, "0", tmp_path / "a.json")
    clock.now += NO_RATE_AFTER_S - 1
    watch.tick()
    assert packing.unrated_gpus == []
    clock.now += 1
    watch.tick()
    assert packing.unrated_gpus == ["0"]


def test_the_watch_thread_reads_by_itself_and_stops(tmp_path: Path) -> None:
    packing, reader = Recorder(), Reader()
    watch = PackingWatch(packing, packing.budgets(), reader, interval_s=0.05)
    try:
        packing.started("a", "0")
        watch.start("a", 4_000_001, "0", tmp_path / "a.json")
        reader.processes = [(9, GIB)]
        deadline = time.monotonic() + 10
        while not packing.samples and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.close()
    assert packing.samples and packing.samples[0][2] == SOURCE_DEVICE
