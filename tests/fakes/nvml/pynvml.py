"""A stand-in for nvidia-ml-py's ``pynvml`` on a machine without a GPU: NVML's answers from
files, so real launchers and real job processes can be tested against GPUs that are not there.

Put this directory first on ``PYTHONPATH`` and point ``FURCATE_FAKE_NVML`` at a state dir:

    <state>/gpus.json          [{"uuid": "GPU-...", "total_mib": 10240, "compute_mode": 0}, ...]
                               (index = position: NVML's PCI bus order)
    <state>/held/<index>/<pid> the MiB process <pid> holds on that GPU (a fake job writes it);
                               a pid no longer alive holds nothing, as with a real driver

Only what furcate calls is here; every call fails as NVML's would before ``nvmlInit``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_FOUND)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


@dataclass(frozen=True)
class _Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


_initialised = 0


def _state() -> Path:
    where = os.environ.get("FURCATE_FAKE_NVML")
    if not where:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    return Path(where)


def _gpus() -> list[dict[str, Any]]:
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return list(json.loads((_state() / "gpus.json").read_text()))


def _gpu(handle: int) -> dict[str, Any]:
    gpus = _gpus()
    if not isinstance(handle, int) or not 0 <= handle < len(gpus):
        raise NVMLError_InvalidArgument()
    return gpus[handle]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held(handle: int) -> list[_Process]:
    _gpu(handle)
    folder = _state() / "held" / str(handle)
    processes = []
    for file in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            pid, mib = int(file.name), float(file.read_text() or 0)
        except (OSError, ValueError):
            continue  # written or removed just now
        if _alive(pid):
            processes.append(_Process(pid, int(mib * 2**20)))
    return processes


def nvmlInit() -> None:
    global _initialised
    if not (_state() / "gpus.json").exists():
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _initialised -= 1


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gpu(index)
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for index, gpu in enumerate(_gpus()):
        if gpu["uuid"] == uuid:
            return index
    raise NVMLError_NotFound()


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpu(handle)["uuid"])


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    total = int(_gpu(handle)["total_mib"] * 2**20)
    used = sum(process.usedGpuMemory for process in _held(handle))
    return _Memory(total, max(0, total - used), used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[_Process]:
    return _held(handle)


def nvmlDeviceGetUtilizationRates(handle: int) -> _Utilization:
    return _Utilization(90 if _held(handle) else 0, 0)


def nvmlDeviceGetComputeMode(handle: int) -> int:
    return int(_gpu(handle).get("compute_mode", NVML_COMPUTEMODE_DEFAULT))
