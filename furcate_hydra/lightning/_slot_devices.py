"""A Trainer that asks for more GPUs than its job's slot has: furcate's error, before Lightning's
("you requested 4 devices but only 1 is visible"), which does not say where the fix is."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError

__all__ = ["check_trainer_devices"]

_GPU_ACCELERATORS = ("gpu", "cuda", "auto")


def check_trainer_devices(
    arguments: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse a Trainer's ``devices`` above the GPUs of its job's slot (FURCATE_GPUS_PER_JOB).

    Only on a GPU slot and for an accelerator that would take GPUs (``gpu``, ``cuda``, or
    ``auto``, which picks them there); ``devices`` of ``auto`` or ``-1`` take what there is.

    Raises:
        FurcateConfigError: naming ``hydra.launcher.gpus_per_job``, what the Trainer asked
            for, and the two ways to make them agree.
    """
    source = os.environ if environ is None else environ
    try:
        slot = int(source.get(env_vars.GPUS_PER_JOB) or 0)
    except ValueError:
        return
    accelerator = arguments.get("accelerator", "auto")
    if slot < 1 or not isinstance(accelerator, str) or accelerator.lower() not in _GPU_ACCELERATORS:
        return
    devices = arguments.get("devices", "auto")
    wanted = _count(devices)
    if wanted is None or wanted <= slot:
        return
    raise FurcateConfigError(
        "hydra.launcher.gpus_per_job",
        slot,
        f"the job's Trainer asks for {wanted} GPUs (devices={devices!r}) and each job's slot "
        f"has {slot}",
        f"set hydra.launcher.gpus_per_job={wanted} to give each job {wanted} GPUs, or the "
        f"Trainer's devices to {slot}",
    )


def _count(devices: Any) -> int | None:
    """How many devices ``devices`` asks for; None for all there are (``auto``, ``-1``)."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return None if devices < 0 else devices
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            return _count(int(text))
        if "," in text:  # "0,1": these GPUs
            return len([part for part in text.split(",") if part.strip()])
        return None
    if isinstance(devices, list | tuple):
        return len(devices)
    return None
