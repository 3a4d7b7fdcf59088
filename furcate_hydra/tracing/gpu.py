"""A job's own GPU memory and its GPU's utilisation, from NVML.

    slot's device ids ─► NVML handle (index or UUID) ──► compute processes on it ──► memory of
                         those whose pid is in the job's process tree; the GPU's utilisation

NVML lists the processes that hold memory on a GPU, each with what it holds, so a job's share
is told apart from its neighbours' on a shared GPU. A job of several GPUs sums its memory over
them (``over_gpus``). NVML is started (``execution.gpu.nvml``) on the first GPU sample, never for
CPU slots. Where NVML cannot answer (no driver, a device it does not know, a MIG instance
without utilisation), the value is None and the trace goes on without it. In a container with
its own pid namespace NVML reports the host's pids, which match no job: the job's GPU memory
then reads 0.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from furcate_hydra.execution.gpu.nvml import Nvml, NvmlUnavailable, start_nvml
from furcate_hydra.said_once import SaidOnce
from furcate_hydra.tracing.process_tree import MIB

__all__ = ["DeviceReading", "GpuUsage", "NvmlSampler", "over_gpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuUsage:
    """What one job holds on its GPU (MiB) and how busy that GPU is (percent)."""

    mem_mb: float | None
    util_percent: float | None


def over_gpus(usages: Sequence[GpuUsage]) -> GpuUsage:
    """A job's figures over its GPUs (``gpus_per_job``): the memory it holds on them all (the
    GPUs NVML answered for; None where none did), and their mean utilisation, so that a
    job of several GPUs reads on the same 0-100 scale as a job of one."""
    held = [usage.mem_mb for usage in usages if usage.mem_mb is not None]
    busy = [usage.util_percent for usage in usages if usage.util_percent is not None]
    return GpuUsage(sum(held) if held else None, sum(busy) / len(busy) if busy else None)


@dataclass(frozen=True)
class DeviceReading:
    """One GPU as NVML sees it now: each compute process's pid and bytes, the memory in use
    and in all (bytes), its utilisation (percent, None where NVML has none)."""

    processes: tuple[tuple[int, int], ...]
    used_bytes: int
    total_bytes: int
    util_percent: float | None


class NvmlSampler:
    """Reads GPU usage through NVML, started once on first use; one thread uses it."""

    def __init__(self, who: str = "the resource trace has no GPU figures") -> None:
        """``who``: what a warning says is missing where NVML cannot answer."""
        self._who = who
        self._nvml: Nvml | None = None
        self._unavailable = False  # NVML failed to start: not tried again
        self._warned = SaidOnce()  # devices (or "" for NVML itself) already warned about
        self._handles: dict[str, object] = {}

    def usage(self, device: str, pids: Collection[int]) -> GpuUsage:
        """The memory ``pids`` hold on ``device`` and its utilisation."""
        nvml = self._start()
        if nvml is None:
            return GpuUsage(None, None)
        try:
            handle = self._handle(nvml, device)
            processes = nvml.processes(handle)
        except Exception as exc:  # NvmlError, or no such device: the trace goes on
            self._warn_once(device, f"cannot read the processes on GPU {device!r}: {exc}")
            return GpuUsage(None, None)
        held = sum(held for pid, held in processes if pid in pids)
        return GpuUsage(held / MIB, _utilisation(nvml, handle))

    def device(self, device: str) -> DeviceReading | None:
        """What NVML says of ``device`` now (three calls); None where it cannot answer."""
        nvml = self._start()
        if nvml is None:
            return None
        try:
            handle = self._handle(nvml, device)
            processes = nvml.processes(handle)
            memory = nvml.memory(handle)
        except Exception as exc:  # NvmlError, or no such device: the watch goes on
            self._warn_once(device, f"cannot read GPU {device!r}: {exc}")
            return None
        return DeviceReading(processes, memory.used, memory.total, _utilisation(nvml, handle))

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.close()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._nvml = None
            self._handles.clear()

    def _start(self) -> Nvml | None:
        if self._nvml is not None or self._unavailable:
            return self._nvml
        try:
            self._nvml = start_nvml()
        except NvmlUnavailable as exc:  # no pynvml, no driver, ...
            self._unavailable = True
            self._warn_once("", f"NVML is not available ({exc})")
        return self._nvml

    def _handle(self, nvml: Nvml, device: str) -> object:
        handle = self._handles.get(device)
        if handle is None:
            handle = self._handles[device] = nvml.handle(device)
        return handle

    def _warn_once(self, device: str, why: str) -> None:
        if self._warned.first(device):
            log.warning("furcate: %s: %s", self._who, why)


def _utilisation(nvml: Nvml, handle: object) -> float | None:
    """The GPU's utilisation (percent), or None where NVML has none (e.g. a MIG instance)."""
    try:
        return nvml.utilisation(handle)
    except Exception:  # NvmlError "Not Supported", or an answer of another shape
        return None
