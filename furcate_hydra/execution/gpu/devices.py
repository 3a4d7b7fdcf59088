"""GPU discovery: which devices exist, how much memory they have free, and what a user named.

NVML is the source of truth for what is installed; ``CUDA_VISIBLE_DEVICES`` is parsed with
CUDA's own rules, except that we refuse malformed entries instead of silently dropping them.
NVML is reached through ``execution.gpu.nvml``, which touches the driver only when a probe asks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu.nvml import NvmlError, NvmlUnavailable, nvml_started

__all__ = [
    "GpuProbe",
    "InstalledGpu",
    "NvmlProbe",
    "normalize_device_id",
    "parse_cuda_visible_devices",
]

# CUDA also accepts unambiguous UUID prefixes, so only the "GPU-"/"MIG-" head is required.
# Old drivers spell MIG devices "MIG-GPU-<uuid>/<gi>/<ci>", hence "/" in the MIG form.
_UUID_RE = re.compile(r"GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+")


@dataclass(frozen=True)
class InstalledGpu:
    """A GPU as NVML lists it: its index (PCI bus order, as jobs number them) and its UUID."""

    index: str
    uuid: str

    def is_named_by(self, device_id: str) -> bool:
        """Whether a normalised device id names this GPU: its index, or its UUID or a prefix
        of it (CUDA takes an unambiguous prefix)."""
        if device_id.isdigit():
            return device_id == self.index
        return device_id.startswith("GPU-") and self.uuid.startswith(device_id)

    def __str__(self) -> str:
        return f"{self.index} ({self.uuid})"


class GpuProbe(Protocol):
    """Source of GPU facts; the planner takes one so tests can run without a GPU."""

    def device_ids(self) -> list[str]:
        """Return ids usable as a ``CUDA_VISIBLE_DEVICES`` value ("0", "GPU-<uuid>", ...)."""
        ...

    def installed(self) -> list[InstalledGpu] | None:
        """Return the GPUs installed, or None where that cannot be known (no NVML)."""
        ...

    def free_memory_bytes(self, device_id: str) -> int:
        """Return the free memory of one device; raise RuntimeError if it cannot be read."""
        ...


def normalize_device_id(entry: object) -> str | None:
    """Return the canonical form of one device id, or None if it is not one.

    Accepts a non-negative int (not bool), a string of digits, or a GPU-/MIG- UUID string.
    """
    if isinstance(entry, bool):
        return None
    if isinstance(entry, int):
        return str(entry) if entry >= 0 else None
    if not isinstance(entry, str):
        return None
    text = entry.strip()
    if text.isascii() and text.isdigit():
        return str(int(text))
    return text if _UUID_RE.fullmatch(text) else None


def parse_cuda_visible_devices(value: str) -> list[str]:
    """Parse a ``CUDA_VISIBLE_DEVICES`` value into device ids.

    "" (or only whitespace) means no GPU. As in CUDA, an entry "-1" ends the list, so "-1"
    alone means no GPU.

    Raises:
        FurcateConfigError: for an entry that is neither a non-negative int nor a UUID, or a
            device listed twice (CUDA would silently truncate the list there).
    """
    if not value.strip():
        return []
    devices: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry == "-1":
            break
        device = normalize_device_id(entry)
        if device is None:
            raise FurcateConfigError(
                "CUDA_VISIBLE_DEVICES",
                value,
                f"entry {entry!r} is neither a GPU index (0, 1, ...) nor a GPU-/MIG- UUID, "
                "and CUDA would silently ignore it and every entry after it",
                "export a comma-separated list such as CUDA_VISIBLE_DEVICES=0,1, "
                "or unset it to use every GPU",
            )
        if device in devices:
            raise FurcateConfigError(
                "CUDA_VISIBLE_DEVICES",
                value,
                f"device {device!r} is listed twice",
                "list each GPU once; use hydra.launcher.jobs_per_gpu to run several jobs on one",
            )
        devices.append(device)
    return devices


class NvmlProbe:
    """GpuProbe backed by NVML; reports no devices where the driver or library is missing."""

    def device_ids(self) -> list[str]:
        """Return "0".."n-1" by NVML index (PCI bus order), or [] when NVML is unavailable."""
        try:
            with nvml_started() as nvml:
                count = nvml.count()
        except NvmlUnavailable:
            # No library, no driver, or no permission: all mean "no usable GPU here".
            return []
        return [str(i) for i in range(count)]

    def installed(self) -> list[InstalledGpu] | None:
        """Return every GPU NVML lists, or None when NVML is unavailable or does not answer."""
        try:
            with nvml_started() as nvml:
                return [
                    InstalledGpu(str(index), nvml.uuid(nvml.handle(str(index))))
                    for index in range(nvml.count())
                ]
        except (NvmlUnavailable, NvmlError):
            return None

    def free_memory_bytes(self, device_id: str) -> int:
        """Return free memory of a device given by NVML index or GPU-/MIG- UUID (or prefix).

        Raises:
            RuntimeError: NVML is unavailable, or the device is unknown or unreadable.
        """
        try:
            with nvml_started() as nvml:
                return nvml.memory(nvml.handle(device_id)).free
        except NvmlUnavailable as exc:
            raise RuntimeError(
                f"cannot read free memory of GPU {device_id!r}: NVML is not available ({exc})"
            ) from exc
        except NvmlError as exc:
            raise RuntimeError(f"cannot read free memory of GPU {device_id!r}: {exc}") from exc
