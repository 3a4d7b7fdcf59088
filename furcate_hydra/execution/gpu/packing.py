"""How many jobs each GPU runs at a time: learned under ``jobs_per_gpu=auto``, lowered by an
out-of-memory beside other jobs under any count.

    the packing watch (its thread, every 0.5 s) ── sample(job, bytes, source) ────────┐
                                                ── rate(GPU, k jobs, steps/s) ────────┤
    the pool (its thread) ── started(job, GPU) / ended(job, its own figures) ─────────┤
                          ◄─ capacity(GPU): open slots now ───────────────────────────┤ GpuPacking
                          ◄─ out_of_memory(job): queue it again, or fail ─────────────┘

A GPU starts at the plan's count (one job under auto; ``jobs_per_gpu``'s or
``gpu_mem_per_job_gb``'s). Under auto, a job's peak is *learned* once it has held for
``SETTLE_S`` seconds of samples, or when the job ends (from the last reading, or from what the
job itself reported where no reading matched it); the sweep's largest learned peak is what one
more job is taken to need. A GPU opens another slot while what its jobs hold (each at least that
peak, a slot open but idle at that peak), plus one more job, plus a margin for a new process's
CUDA context, fits in the memory it had free before the sweep, while the last job added paid in
throughput (``gpu_throughput``), up to its slots (``max_jobs_per_gpu``, or what the machine's
cores can drive). Under any count, a job that runs out of GPU memory beside others is queued
again and its GPU loses a slot (never below one) for the rest of the sweep; one that ran out
alone on its GPU fails: it does not fit there.

Nothing here imports Hydra, torch or NVML; one lock guards the state, as two threads use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from furcate_hydra.execution.gpu.throughput import ThroughputClimb
from furcate_hydra.execution.slots import GpuStart

__all__ = ["GIB", "SETTLE_S", "GpuPacking", "MemoryVerdict"]

log = logging.getLogger(__name__)

GIB = 2**30
# A job's peak counts as learned once it has not grown for this long (seconds of samples).
SETTLE_S = 2.0
# Where a learned peak came from, as the GPU's line says it.
SOURCE_PROCESS = "NVML, the job's processes"
SOURCE_DEVICE = "NVML, the GPU's used memory shared by its jobs"
SOURCE_REPORT = "the job's own figures at its end"


@dataclass
class _JobMemory:
    device: str
    peak: int = 0  # bytes, the most it held in any sample
    risen_at: float = 0.0  # when the peak last grew
    source: str = ""
    learned: bool = False
    beside_others: bool = False  # another job ran on its GPU while it ran


@dataclass
class _Gpu:
    budget: int  # bytes its jobs may fill: free before the sweep
    open: int  # jobs at a time now
    ceiling: int  # open never grows past it (its slots, lowered by OOMs and the climb)
    max_reached: int
    climb: ThroughputClimb
    peak: int = 0  # the largest learned peak of a job on it
    source: str = ""  # where that peak came from
    backoffs: int = 0  # out-of-memory back-offs
    running: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class MemoryVerdict:
    """What to do with a job that ran out of GPU memory, and why, in words."""

    queue_again: bool
    why: str


class GpuPacking:
    """The open slots of every GPU (see the module doc)."""

    def __init__(
        self,
        starts: Mapping[str, GpuStart],
        most: Mapping[str, int],
        margin_bytes: int,
        *,
        grows: bool = True,
        min_gain: float = 0.05,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """``starts``: each GPU's open slots and memory budget at first; ``most``: the slots
        each GPU has; ``grows``: whether counts are learned (``jobs_per_gpu=auto``) or fixed;
        ``min_gain``: what one more job must add to a GPU's rate; ``say``: where a line about
        what could not be learned goes (``log.info`` if None)."""
        self.grows = grows
        self._lock = threading.Lock()
        self._margin = margin_bytes
        self._say = say or log.info
        self._gpus = {}
        for device, start in starts.items():
            ceiling = most.get(device, start.jobs)
            first = min(start.jobs, ceiling)
            climb = ThroughputClimb(min_gain)
            self._gpus[device] = _Gpu(start.budget_bytes, first, ceiling, first, climb)
        self._jobs: dict[str, _JobMemory] = {}
        self._peak = 0  # the sweep's largest learned peak: what one more job needs
        self._grew = False
        self._unlearned_said = False

    # -- the pool's thread ---------------------------------------------------------------

    def capacity(self, device: str | None) -> int | None:
        """How many jobs ``device`` runs at a time now; None: not packed (a CPU slot)."""
        gpu = self._gpus.get(device) if device is not None else None
        if gpu is None:
            return None
        with self._lock:
            return gpu.open

    def open_slots(self) -> int:
        """Jobs that run at once now, over every GPU."""
        with self._lock:
            return sum(gpu.open for gpu in self._gpus.values())

    def started(self, key: str, device: str) -> None:
        """A job's process runs on ``device``."""
        with self._lock:
            gpu = self._gpus.get(device)
            if gpu is None:
                return
            job = self._jobs[key] = _JobMemory(device)
            gpu.running.add(key)
            if len(gpu.running) > 1:
                job.beside_others = True
                for other in gpu.running:
                    self._jobs[other].beside_others = True

    def ended(self, key: str, reported_bytes: int | None = None) -> None:
        """A job's process ended: its peak is learned, from its last readings, or else from
        ``reported_bytes`` (what the job said it held, e.g. torch's figures plus a context)."""
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is None:
                return
            gpu = self._gpus[job.device]
            gpu.running.discard(key)
            if not self.grows or job.learned:
                return
            if not job.peak and reported_bytes:
                job.peak, job.source = reported_bytes, SOURCE_REPORT
            if job.peak:
                self._learn(gpu, job)
                self._grow_all()
            elif not self._unlearned_said:
                self._unlearned_said = True
                self._say(
                    f"furcate: jobs_per_gpu=auto: a job on GPU {job.device} ended before its "
                    f"GPU memory could be read; GPU {job.device} stays at {gpu.open} at a time "
                    "until a job's memory is seen (said once)"
                )

    def out_of_memory(self, key: str) -> MemoryVerdict:
        """A job ran out of GPU memory (call before ``ended``): queue it again on a GPU with
        one slot less, or, where it ran alone, fail it."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return MemoryVerdict(False, "it ran out of GPU memory")
            gpu, device = self._gpus[job.device], job.device
            if not job.beside_others:
                total = f"{gpu.budget / GIB:.1f} GiB free at the start; " if gpu.budget else ""
                return MemoryVerdict(
                    False,
                    f"it ran out of GPU memory alone on GPU {device} ({total}the most it was "
                    f"seen to hold: {job.peak / GIB:.1f} GiB): it does not fit on this GPU. "
                    "Make the job smaller (batch size, model, precision) or run it on a GPU "
                    "with more memory",
                )
            at = len(gpu.running)
            gpu.ceiling = max(1, min(gpu.ceiling, at - 1))
            gpu.open = max(1, min(gpu.open, at) - 1)
            gpu.backoffs += 1
            return MemoryVerdict(
                True,
                f"it ran out of GPU memory on GPU {device} beside {at - 1} other job"
                f"{'' if at == 2 else 's'}; GPU {device} now runs {gpu.open} at a time for the "
                "rest of the sweep",
            )

    def take_growth(self) -> bool:
        """Whether a GPU opened slots since the last call (the pool places queued jobs)."""
        with self._lock:
            grew, self._grew = self._grew, False
            return grew

    # -- the packing watch's thread ------------------------------------------------------

    def sample(self, key: str, held_bytes: int, source: str, at: float | None = None) -> None:
        """One reading of what a running job holds on its GPU, and where it was read."""
        now = time.monotonic() if at is None else at
        with self._lock:
            job = self._jobs.get(key)
            if job is None or not self.grows:
                return
            if held_bytes > job.peak:
                # a peak learned earlier no longer holds: it is learned again once this one
                # has held, or at the job's end
                job.peak, job.risen_at, job.source = held_bytes, now, source
                job.learned = False
                return
            if job.peak and not job.learned and now - job.risen_at >= SETTLE_S:
                self._learn(self._gpus[job.device], job)
                self._grow_all()

    def rate(self, device: str, jobs: int, value: float, unit: str) -> None:
        """A GPU's aggregate rate while ``jobs`` jobs trained on it."""
        with self._lock:
            gpu = self._gpus.get(device)
            if gpu is None or not self.grows:
                return
            gpu.climb.reading(jobs, value, unit)
            stop = gpu.climb.stop_at(gpu.max_reached)
            if stop is not None and gpu.ceiling > stop:
                gpu.ceiling = stop
                gpu.open = min(gpu.open, stop)  # the last slot closes once its job ends
            self._grow_all()

    def unrated(self, device: str) -> None:
        """``device``'s jobs give no rate (no progress, no utilisation): memory alone decides."""
        with self._lock:
            gpu = self._gpus.get(device)
            if gpu is None or gpu.climb.unrated or gpu.climb.unit is not None:
                return
            gpu.climb.unrated = True
            self._grow_all()

    def budgets(self) -> dict[str, int]:
        """Each GPU's memory its jobs may fill: what was free before the sweep (bytes)."""
        return {device: gpu.budget for device, gpu in self._gpus.items()}

    # -- what was learned ----------------------------------------------------------------

    def lines(self) -> list[str]:
        """Per GPU, what was learned: "GPU 0: 5 at a time, peak 11.2 GiB per job"; with a
        fixed count, only the GPUs that backed off."""
        return [
            self._line(device, gpu)
            for device, gpu in self._gpus_now()
            if self.grows or gpu.backoffs
        ]

    def snapshot(self) -> dict[str, dict[str, float | int | str]]:
        """Per GPU: jobs_at_a_time, max_reached, peak_gib_per_job, budget_gib, oom_backoffs,
        and where the climb stopped and the peak came from (auto)."""
        return {
            device: {
                "jobs_at_a_time": gpu.open,
                "max_reached": gpu.max_reached,
                "peak_gib_per_job": round(gpu.peak / GIB, 3),
                "budget_gib": round(gpu.budget / GIB, 3),
                "oom_backoffs": gpu.backoffs,
                "peak_source": gpu.source,
                "stopped_because": gpu.climb.why,
            }
            for device, gpu in self._gpus_now()
        }

    def _gpus_now(self) -> list[tuple[str, _Gpu]]:
        """Each GPU's state as it is now, copied under the lock (its running set left out)."""
        with self._lock:
            return [(device, replace(gpu, running=set())) for device, gpu in self._gpus.items()]

    def _line(self, device: str, gpu: _Gpu) -> str:
        text = f"GPU {device}: {gpu.open} at a time"
        if self.grows and not gpu.peak:
            text += ", no job's peak learned yet"
        elif self.grows:
            text += f", peak {gpu.peak / GIB:.1f} GiB per job ({gpu.source})"
        if gpu.max_reached != gpu.open:
            text += f" (at most {gpu.max_reached})"
        if gpu.climb.why:
            text += f": {gpu.climb.why}"
        if gpu.backoffs:
            text += f", {gpu.backoffs} out-of-memory back-off{'' if gpu.backoffs == 1 else 's'}"
        return text

    # -- under the lock ------------------------------------------------------------------

    def _learn(self, gpu: _Gpu, job: _JobMemory) -> None:
        job.learned = True
        if job.peak > gpu.peak:
            gpu.peak, gpu.source = job.peak, job.source
        self._peak = max(self._peak, job.peak)

    def _grow_all(self) -> None:
        if not self._peak:
            return
        for gpu in self._gpus.values():
            while (
                gpu.open < gpu.ceiling and self._fits_one_more(gpu) and gpu.climb.may_open(gpu.open)
            ):
                gpu.open += 1
                gpu.max_reached = max(gpu.max_reached, gpu.open)
                self._grew = True

    def _fits_one_more(self, gpu: _Gpu) -> bool:
        held = sum(max(self._jobs[key].peak, self._peak) for key in gpu.running)
        idle = max(0, gpu.open - len(gpu.running)) * self._peak
        return held + idle + self._peak + self._margin <= gpu.budget
