"""Slots of several GPUs (``hydra.launcher.gpus_per_job``): a plan's GPUs taken N at a time.

A slot of N GPUs names them as ``CUDA_VISIBLE_DEVICES`` does, comma-separated ("0,1"), and
that string is its device everywhere a slot's GPU is a key (the slot book, the packing, the
tally, the run's record): such a group is never shared between jobs, so it counts as one
unit. Only what reads a GPU itself (the resource trace through NVML) splits it.
"""

from __future__ import annotations

from collections.abc import Sequence

from furcate_hydra.errors import FurcateConfigError

__all__ = ["KEY", "group_devices", "rank_threads", "slot_devices"]

KEY = "hydra.launcher.gpus_per_job"


def slot_devices(device: str | None) -> tuple[str, ...]:
    """The GPU ids of a slot's device: one, several ("0,1"), or none (a CPU slot)."""
    return tuple(device.split(",")) if device else ()


def group_devices(devices: Sequence[str], per_job: int, origin: str) -> tuple[list[str], str]:
    """``devices`` taken ``per_job`` at a time, in their order (NVML's is the PCI bus's), and
    a note naming the GPUs left over ("" when none are).

    Args:
        devices: The plan's GPUs, in order.
        per_job: GPUs per slot (``gpus_per_job``), 1 or more.
        origin: Where ``devices`` came from, as the error says it.

    Raises:
        FurcateConfigError: fewer GPUs than one job needs, or a MIG instance among several
            (CUDA shows a process one MIG instance at most).
    """
    if per_job == 1:
        return list(devices), ""
    mig = [device for device in devices if device.startswith("MIG-")]
    if mig:
        raise FurcateConfigError(
            KEY,
            per_job,
            f"{mig[0]} is a MIG instance, and CUDA gives a process one MIG instance at most",
            "name whole GPUs (indices or GPU- UUIDs), or set gpus_per_job=1",
        )
    if len(devices) < per_job:
        have = len(devices)
        raise FurcateConfigError(
            KEY,
            per_job,
            f"one job needs {per_job} GPUs and there {'is' if have == 1 else 'are'} only "
            f"{have} ({','.join(devices)}, from {origin})",
            f"set gpus_per_job to at most {have}, or give the sweep {per_job} GPUs or more "
            "(hydra.launcher.gpus, CUDA_VISIBLE_DEVICES, or a Slurm job's --gres=gpu:N)",
        )
    count = len(devices) // per_job
    groups = [",".join(devices[i * per_job : (i + 1) * per_job]) for i in range(count)]
    spare = devices[count * per_job :]
    note = f"GPU{'' if len(spare) == 1 else 's'} {','.join(spare)} unused" if spare else ""
    return groups, note


def rank_threads(cores: int, per_job: int) -> int:
    """Threads each of a job's ``per_job`` ranks gets from the job's ``cores``: they share
    them, and a rank per GPU with every core's worth of threads would oversubscribe them."""
    return max(1, cores // per_job)
