"""``jobs_per_gpu=auto``: how many jobs each GPU runs at a time, learned from their memory.

    the resource trace (its thread) ── sample(job, GPU memory it holds) ──┐
    the pool (its thread) ── started(job, GPU) / ended(job) ──────────────┤
                          ◄─ capacity(GPU): open slots now ───────────────┤ GpuPacking
                          ◄─ out_of_memory(job): queue it again, or fail ─┘

A GPU starts at the plan's count (one job, or ``gpu_mem_per_job_gb``'s). A job's peak is
*learned* once it ended or its measured peak has not grown for ``SETTLE_SAMPLES`` samples;
the sweep's largest learned peak is what one more job is taken to need. A GPU opens another
slot while what its jobs hold (each at least that peak, a slot open but idle at that peak),
plus one more job, plus a margin for a new process's CUDA context, fits in the memory it had
free before the sweep, up to ``max_jobs_per_gpu``. A job that runs out of GPU memory beside
others is queued again and its GPU loses a slot (never below one) and never grows back to the
count it failed at; one that ran out alone on its GPU fails: it does not fit there.

Nothing here imports Hydra, torch or NVML; one lock guards the state, as two threads use it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from furcate_hydra.execution.slots import GpuStart

__all__ = ["GIB", "SETTLE_SAMPLES", "GpuPacking", "MemoryVerdict"]

GIB = 2**30
# A job's peak counts as learned once this many samples in a row did not raise it.
SETTLE_SAMPLES = 3


@dataclass
class _JobMemory:
    device: str
    peak: int = 0  # bytes, the most it held in any sample
    flat: int = 0  # samples in a row that did not raise the peak
    beside_others: bool = False  # another job ran on its GPU while it ran

    @property
    def settled(self) -> bool:
        return self.flat >= SETTLE_SAMPLES


@dataclass
class _Gpu:
    budget: int  # bytes its jobs may fill: free before the sweep
    open: int  # jobs at a time now
    ceiling: int  # open never grows past it (max_jobs_per_gpu, lowered by OOMs)
    max_reached: int
    peak: int = 0  # the largest learned peak of a job on it
    backoffs: int = 0  # out-of-memory back-offs
    running: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class MemoryVerdict:
    """What to do with a job that ran out of GPU memory, and why, in words."""

    queue_again: bool
    why: str


class GpuPacking:
    """The open slots of every GPU under ``jobs_per_gpu=auto`` (see the module doc)."""

    def __init__(
        self, starts: Mapping[str, GpuStart], most: Mapping[str, int], margin_bytes: int
    ) -> None:
        """``starts``: each GPU's open slots and memory budget at first; ``most``: the slots
        each GPU has (``max_jobs_per_gpu``, fewer under ``max_workers``)."""
        self._lock = threading.Lock()
        self._margin = margin_bytes
        self._gpus = {}
        for device, start in starts.items():
            ceiling = most.get(device, start.jobs)
            first = min(start.jobs, ceiling)
            self._gpus[device] = _Gpu(start.budget_bytes, first, ceiling, first)
        self._jobs: dict[str, _JobMemory] = {}
        self._peak = 0  # the sweep's largest learned peak: what one more job needs
        self._grew = False

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

    def ended(self, key: str) -> None:
        """A job's process ended: its peak is learned."""
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is None:
                return
            gpu = self._gpus[job.device]
            gpu.running.discard(key)
            self._learn(gpu, job.peak)
            self._grow_all()

    def out_of_memory(self, key: str) -> MemoryVerdict:
        """A job ran out of GPU memory (call before ``ended``): queue it again on a GPU with
        one slot less, or, where it ran alone, fail it."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return MemoryVerdict(False, "it ran out of GPU memory")
            gpu, device = self._gpus[job.device], job.device
            total = f"{gpu.budget / GIB:.1f} GiB free at the start"
            if not job.beside_others:
                return MemoryVerdict(
                    False,
                    f"it ran out of GPU memory alone on GPU {device} ({total}; the most it was "
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
                f"{'' if at == 2 else 's'}; GPU {device} now runs {gpu.open} at a time",
            )

    def take_growth(self) -> bool:
        """Whether a GPU opened slots since the last call (the pool places queued jobs)."""
        with self._lock:
            grew, self._grew = self._grew, False
            return grew

    # -- the resource trace's thread -----------------------------------------------------

    def sample(self, key: str, held_mb: float) -> None:
        """One sample of what a running job holds on its GPU (MiB, by NVML)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return
            held = int(held_mb * 2**20)
            if held > job.peak:
                job.peak, job.flat = held, 0
                return
            job.flat += 1
            if job.flat == SETTLE_SAMPLES:
                self._learn(self._gpus[job.device], job.peak)
                self._grow_all()

    # -- what was learned ----------------------------------------------------------------

    def lines(self) -> list[str]:
        """Per GPU, what was learned: "GPU 0: 5 at a time, peak 11.2 GiB per job"."""
        return [self._line(device, gpu) for device, gpu in self._gpus_now()]

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        """Per GPU: jobs_at_a_time, max_reached, peak_gib_per_job, budget_gib, oom_backoffs."""
        return {
            device: {
                "jobs_at_a_time": gpu.open,
                "max_reached": gpu.max_reached,
                "peak_gib_per_job": round(gpu.peak / GIB, 3),
                "budget_gib": round(gpu.budget / GIB, 3),
                "oom_backoffs": gpu.backoffs,
            }
            for device, gpu in self._gpus_now()
        }

    def _gpus_now(self) -> list[tuple[str, _Gpu]]:
        """Each GPU's state as it is now, copied under the lock (its running set left out)."""
        with self._lock:
            return [(device, replace(gpu, running=set())) for device, gpu in self._gpus.items()]

    @staticmethod
    def _line(device: str, gpu: _Gpu) -> str:
        if not gpu.peak:
            text = f"GPU {device}: {gpu.open} at a time, no job's peak learned yet"
        else:
            text = f"GPU {device}: {gpu.open} at a time, peak {gpu.peak / GIB:.1f} GiB per job"
        if gpu.max_reached != gpu.open:
            text += f" (at most {gpu.max_reached})"
        if gpu.backoffs:
            text += f", {gpu.backoffs} out-of-memory back-off{'' if gpu.backoffs == 1 else 's'}"
        return text

    # -- under the lock ------------------------------------------------------------------

    def _learn(self, gpu: _Gpu, peak: int) -> None:
        gpu.peak = max(gpu.peak, peak)
        self._peak = max(self._peak, peak)

    def _grow_all(self) -> None:
        if not self._peak:
            return
        for gpu in self._gpus.values():
            while gpu.open < gpu.ceiling and self._fits_one_more(gpu):
                gpu.open += 1
                gpu.max_reached = max(gpu.max_reached, gpu.open)
                self._grew = True

    def _fits_one_more(self, gpu: _Gpu) -> bool:
        held = sum(max(self._jobs[key].peak, self._peak) for key in gpu.running)
        idle = max(0, gpu.open - len(gpu.running)) * self._peak
        return held + idle + self._peak + self._margin <= gpu.budget
