"""What ``jobs_per_gpu=auto`` learns from: every packed GPU read twice a second, apart from the
resource trace (whose interval is for trace.csv and may be 10 s: a job of a few seconds would
never be seen).

    owner thread:  start(job, pid, GPU, progress file) / end(job)
    watch thread:  every INTERVAL_S, per GPU with jobs: one NVML reading (processes, memory,
                   utilisation) ──► each job's memory ──► GpuPacking.sample
                   each job's progress.json ──► its steps/s ──► the sum over the jobs training
                   now, at that many jobs ──► GpuPacking.rate
                   or, where no job reports progress, the GPU's utilisation ──► GpuPacking.rate

A job's memory is what NVML's compute processes of its session hold (every job leads its own
session: its DataLoader workers and any process it starts are in it). Where NVML's pids match
none of a GPU's jobs (a container with its own pid namespace), the GPU's used memory above what
was in use before the sweep is shared evenly among its jobs; each sample says which source it
came from. A job is *training* while its last two progress reports are recent: a job still
starting (imports, data, its CUDA context) or one between epochs in validation is not counted,
so in a sweep whose jobs come and go every second the GPU's rate at k jobs is still read.
Nothing here decides: ``GpuPacking`` does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from furcate_hydra.execution.gpu.packing import SOURCE_DEVICE, SOURCE_PROCESS, GpuPacking
from furcate_hydra.progress import read_progress
from furcate_hydra.tracing.gpu import DeviceReading, NvmlSampler

__all__ = ["INTERVAL_S", "PackingWatch"]

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
# Utilisation counts once every job on the GPU has run this long and the count held half as
# long: a job that just started holds a CUDA context but runs no kernel yet.
UTIL_SETTLE_S = 2.0
# A job's rate counts while its older progress report is at most this old (jobs write one a
# second under auto).
FRESH_S = 3.0
# A GPU whose jobs report no progress and whose utilisation NVML cannot give, after this
# long, is packed by memory alone.
NO_RATE_AFTER_S = 10.0
STEPS = "steps/s"
UTILISATION = "% GPU utilisation"


class DeviceReader(Protocol):
    def device(self, device: str) -> DeviceReading | None: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class _Job:
    key: str
    pid: int
    device: str
    progress: Path
    started: float  # wall clock, as progress.json's times
    points: list[tuple[float, int]] = field(default_factory=list)  # (at, step), the last two
    mtime: int = 0


class PackingWatch:
    """Feeds ``packing`` with its jobs' memory and its GPUs' rates (see the module doc).

    ``start``/``end`` are called by one owner thread and only touch a dict under a lock;
    ``tick`` runs on the watch's own thread (and in tests, directly).
    """

    def __init__(
        self,
        packing: GpuPacking,
        budgets: dict[str, int],
        reader: DeviceReader | None = None,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
        thread: bool = True,
    ) -> None:
        """``budgets``: per GPU, the bytes free before the sweep (what was in use then is its
        total less that); ``thread``: False leaves ticking to the caller."""
        self._packing = packing
        self._budgets = dict(budgets)
        self._reader: DeviceReader = reader or NvmlSampler("jobs_per_gpu=auto cannot read a GPU")
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._level_since: dict[str, tuple[int, float]] = {}  # GPU -> (jobs, since when)
        self._rated: set[str] = set()  # GPUs whose jobs reported progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="furcate-packing", daemon=True)
            self._thread.start()

    # -- the owner's thread --------------------------------------------------------------

    def start(self, key: str, pid: int, device: str, progress: Path) -> None:
        with self._lock:
            self._jobs[key] = _Job(key, pid, device, progress, self._clock())
            self._count_changed(device)

    def end(self, key: str) -> None:
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is not None:
                self._count_changed(job.device)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._reader.close()

    # -- the watch's thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self.tick()
        except Exception:  # never takes the launcher down; auto keeps what it learned
            log.exception("furcate: jobs_per_gpu=auto stopped learning")

    def tick(self) -> None:
        """Read every GPU that runs jobs once, and tell the packing."""
        with self._lock:
            by_device: dict[str, list[_Job]] = {}
            for job in self._jobs.values():
                by_device.setdefault(job.device, []).append(job)
            levels = dict(self._level_since)
        now = self._clock()
        for device, jobs in by_device.items():
            reading = self._reader.device(device)
            if reading is not None:
                self._memory(device, jobs, reading)
            jobs_now, since = levels.get(device, (len(jobs), now))
            if jobs_now != len(jobs):
                continue  # a job started or ended while this was read
            self._rate(device, jobs, reading, since, now)

    def _memory(self, device: str, jobs: list[_Job], reading: DeviceReading) -> None:
        held: dict[str, int] = {}
        for pid, size in reading.processes:
            owner = _session(pid)
            for job in jobs:
                if pid == job.pid or owner == job.pid:
                    held[job.key] = held.get(job.key, 0) + size
        if held:
            for key, size in held.items():
                self._packing.sample(key, size, SOURCE_PROCESS)
            return
        before = reading.total_bytes - self._budgets.get(device, reading.total_bytes)
        above = reading.used_bytes - before
        if reading.processes and above > 0:  # NVML's pids are of another namespace
            for job in jobs:
                self._packing.sample(job.key, above // len(jobs), SOURCE_DEVICE)

    def _rate(
        self,
        device: str,
        jobs: list[_Job],
        reading: DeviceReading | None,
        since: float,
        now: float,
    ) -> None:
        rates = [self._steps_per_s(job, now) for job in jobs]
        if device in self._rated:
            training = [rate for rate in rates if rate is not None]
            if training:
                self._packing.rate(device, len(training), sum(training), STEPS)
            return
        settled = now - since >= UTIL_SETTLE_S / 2 and all(
            now - job.started >= UTIL_SETTLE_S for job in jobs
        )
        if reading is not None and reading.util_percent is not None:
            if settled:
                self._packing.rate(device, len(jobs), reading.util_percent, UTILISATION)
        elif all(now - job.started >= NO_RATE_AFTER_S for job in jobs):
            self._packing.unrated(device)

    def _steps_per_s(self, job: _Job, now: float) -> float | None:
        """The job's steps/s between its last two progress reports, while it trains (the
        older at most FRESH_S old)."""
        try:
            mtime = job.progress.stat().st_mtime_ns
        except OSError:
            mtime = 0
        if mtime and mtime != job.mtime:
            job.mtime = mtime
            progress = read_progress(job.progress)
            if progress is not None and progress.at >= job.started:
                self._rated.add(job.device)
                job.points = [*job.points[-1:], (progress.at, progress.step)]
        if len(job.points) < 2 or now - job.points[0][0] > FRESH_S:
            return None
        (t0, s0), (t1, s1) = job.points
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 >= s0 else None

    # -- under the lock ------------------------------------------------------------------

    def _count_changed(self, device: str) -> None:
        count = sum(1 for job in self._jobs.values() if job.device == device)
        self._level_since[device] = (count, self._clock())


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone, or not ours to ask
        return None
