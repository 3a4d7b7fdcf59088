"""The one door to NVML (nvidia-ml-py's ``import pynvml``): no other module imports it.

    nvml_started() ─ with-block: NVML started for one query, shut down after it
    start_nvml() ─── an Nvml held for long (the resource trace's sampler), until its close()
        └─ pynvml missing, no driver, no permission ............... NvmlUnavailable
    Nvml.handle(device id) ─ an index, a GPU-/MIG- UUID, or (as CUDA takes) a UUID's prefix
    Nvml.count / uuid / memory / compute_mode / processes / utilisation
        └─ NVML answers with an error code (NotSupported, GPU lost, ...) ...... NvmlError

``pynvml`` is imported when NVML is started, never when this module is: importing it touches
no driver, and tests replace ``pynvml`` (on the import path, in ``sys.modules``, or its
functions) after furcate is imported. NVML counts its inits, so sessions may nest: each
shuts down what it started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

__all__ = ["Nvml", "NvmlError", "NvmlMemory", "NvmlUnavailable", "nvml_started", "start_nvml"]

T = TypeVar("T")


class NvmlUnavailable(RuntimeError):
    """NVML cannot start here: no ``pynvml``, no driver or library, or no permission."""


class NvmlError(RuntimeError):
    """An NVML call failed; its message is NVML's (e.g. "Not Supported", "GPU is lost")."""


@dataclass(frozen=True)
class NvmlMemory:
    """A GPU's memory in bytes, as ``nvmlDeviceGetMemoryInfo`` gives it (total = free + used)."""

    total: int
    free: int
    used: int


class Nvml:
    """NVML, started: the calls furcate makes of it, each failing with ``NvmlError``."""

    def __init__(self, library: ModuleType) -> None:
        self._lib = library

    def count(self) -> int:
        """How many GPUs NVML lists (indices 0..count-1, PCI bus order)."""
        return int(self._call(self._lib.nvmlDeviceGetCount))

    def handle(self, device_id: str) -> object:
        """The handle of a device id as slots name it: an index, a GPU-/MIG- UUID, or a UUID's
        prefix.

        Raises:
            NvmlError: NVML does not know the device.
            RuntimeError: no GPU's UUID starts with the prefix.
        """
        lib = self._lib
        if device_id.isdigit():
            return self._call(lib.nvmlDeviceGetHandleByIndex, int(device_id))
        try:
            return lib.nvmlDeviceGetHandleByUUID(device_id)
        except (lib.NVMLError_NotFound, lib.NVMLError_InvalidArgument) as exc:
            if not device_id.startswith("GPU-"):
                raise NvmlError(str(exc)) from exc
        except lib.NVMLError as exc:
            raise NvmlError(str(exc)) from exc
        # CUDA accepts a UUID prefix but NVML wants the whole UUID, so match the prefix here.
        for index in range(self.count()):
            handle = self._call(lib.nvmlDeviceGetHandleByIndex, index)
            if self.uuid(handle).startswith(device_id):
                return handle
        raise RuntimeError(f"no GPU has a UUID starting with {device_id!r}")

    def uuid(self, handle: object) -> str:
        return str(self._call(self._lib.nvmlDeviceGetUUID, handle))

    def memory(self, handle: object) -> NvmlMemory:
        info = self._call(self._lib.nvmlDeviceGetMemoryInfo, handle)
        return NvmlMemory(int(info.total), int(info.free), int(info.used))

    def compute_mode(self, handle: object) -> str:
        """The GPU's compute mode as NVML names it: "DEFAULT", "EXCLUSIVE_PROCESS", ..."""
        lib = self._lib
        names = {
            lib.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
            lib.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
            lib.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
            lib.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
        }
        mode = int(self._call(lib.nvmlDeviceGetComputeMode, handle))
        return names.get(mode, f"mode {mode}")

    def processes(self, handle: object) -> tuple[tuple[int, int], ...]:
        """Each compute process on the GPU: its pid and the bytes it holds (0 where NVML
        cannot say)."""
        listed = self._call(self._lib.nvmlDeviceGetComputeRunningProcesses, handle)
        return tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in listed)

    def utilisation(self, handle: object) -> float:
        """The percent of NVML's last sample period in which a kernel ran on the GPU."""
        return float(self._call(self._lib.nvmlDeviceGetUtilizationRates, handle).gpu)

    def close(self) -> None:
        """Shut down what ``start_nvml`` started."""
        self._call(self._lib.nvmlShutdown)

    def _call(self, call: Callable[..., T], *args: object) -> T:
        try:
            return call(*args)
        except self._lib.NVMLError as exc:
            raise NvmlError(str(exc)) from exc


def start_nvml() -> Nvml:
    """NVML started, until the ``close()`` of what it returns.

    Raises:
        NvmlUnavailable: ``pynvml`` is not installed, or ``nvmlInit`` failed.
    """
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(str(exc)) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(str(exc)) from exc
    return Nvml(pynvml)


@contextmanager
def nvml_started() -> Iterator[Nvml]:
    """NVML started for the with-block and shut down after it (``start_nvml``'s errors)."""
    nvml = start_nvml()
    try:
        yield nvml
    finally:
        nvml.close()
