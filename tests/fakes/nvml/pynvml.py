"""A stand-in for nvidia-ml-py's ``pynvml`` on a machine without a GPU: NVML's answers from
files, so real launchers and real job processes can be tested against GPUs that are not there.

Put this directory first on ``PYTHONPATH`` and point ``FURCATE_FAKE_NVML`` at a state dir:

    <state>/gpus.json          [{"uuid": "GPU-...", "total_mib": 10240, "compute_mode": 0,
                                 "reserved_mib": 0, "busy_percent": 20}, ...]
                               (index = position: NVML's PCI bus order; reserved_mib, optional:
                               what the driver keeps for itself, counted in ``used``;
                               busy_percent, optional: the share of time one process holding
                               memory keeps kernels running, see utilisation below)
    <state>/held/<index>/<pid> the MiB process <pid> holds on that GPU (a fake job writes it);
                               a pid that has exited (a zombie included) holds nothing, as with
                               a real driver, which frees a process's memory as it exits

Only what furcate calls is here, with NVML's documented behaviour (NVML API reference): every
call but ``nvmlInit`` fails with Uninitialized before it and after the last ``nvmlShutdown``
(inits are counted); ``nvmlMemory_t`` (v1): total = free + used, used including the reserved
memory; an unknown UUID is NotFound, an index out of range InvalidArgument. Errors are raised
as nvidia-ml-py raises them: ``NVMLError(code)`` is the code's own subclass
(``NVMLError_NotFound``, ...), its ``value`` the code. ``tests/contracts/test_nvml_contract.py``
holds this fake and the real driver to the same contract.

Utilisation (``nvmlUtilization_t.gpu``) is, by NVML's definition, the percent of the last sample
period during which one or more kernels ran. Processes sharing a GPU by time-slicing add their
busy time until the GPU is never idle, so the fake answers ``min(100, busy_percent x the
processes holding memory)``: each more process raises it, until it stops at 100.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
# nvmlProcessInfo_t's gpuInstanceId and computeInstanceId where MIG is off
_NO_INSTANCE = 0xFFFFFFFF

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """An NVML return code; ``NVMLError(code)`` is that code's subclass, as in nvidia-ml-py."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        error = Exception.__new__(cls)
        error.value = value
        return error

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


class _CodeError(NVMLError):
    """One code's error, made bare as ``NVMLError_NotFound()`` or as ``NVMLError(code)``."""

    code: ClassVar[int]

    def __new__(cls, *args: object) -> _CodeError:
        error = Exception.__new__(cls)
        error.value = cls.code
        return error

    def __init_subclass__(cls) -> None:
        NVMLError._by_code[cls.code] = cls


class NVMLError_Uninitialized(_CodeError):
    code = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(_CodeError):
    code = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(_CodeError):
    code = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(_CodeError):
    code = NVML_ERROR_NO_PERMISSION


class NVMLError_NotFound(_CodeError):
    code = NVML_ERROR_NOT_FOUND


class NVMLError_DriverNotLoaded(_CodeError):
    code = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(_CodeError):
    code = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_GpuIsLost(_CodeError):
    code = NVML_ERROR_GPU_IS_LOST


class NVMLError_Unknown(_CodeError):
    code = NVML_ERROR_UNKNOWN


@dataclass(frozen=True)
class _Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


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
    """Whether ``pid`` runs: an exited process not yet reaped (a zombie) has released its
    device files, so the driver no longer counts it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # the state follows the command name, which may hold spaces and parentheses
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to read: take kill's word
    return state not in ("Z", "X")


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
    gpu = _gpu(handle)
    total = int(gpu["total_mib"] * 2**20)
    reserved = int(gpu.get("reserved_mib", 0) * 2**20)
    # v1: used is the reserved memory plus what processes hold, and total = free + used
    used = min(total, reserved + sum(process.usedGpuMemory for process in _held(handle)))
    return _Memory(total, total - used, used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[_Process]:
    return _held(handle)


def nvmlDeviceGetUtilizationRates(handle: int) -> _Utilization:
    busy = int(_gpu(handle).get("busy_percent", 20))
    return _Utilization(min(100, busy * len(_held(handle))), 0)


def nvmlDeviceGetComputeMode(handle: int) -> int:
    return int(_gpu(handle).get("compute_mode", NVML_COMPUTEMODE_DEFAULT))
