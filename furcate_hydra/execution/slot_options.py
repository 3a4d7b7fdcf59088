"""The launcher's options that shape slots, checked when made (``hydra.launcher`` keys of the
same names, whose defaults live in the launcher's config); ``slots.plan_slots`` says what they
mean."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu.devices import normalize_device_id

__all__ = ["AUTO", "SlotOptions", "explicit_gpus"]

# jobs_per_gpu=auto: each GPU's count is learned from its jobs' measured memory (gpu_packing)
AUTO = "auto"


@dataclass(frozen=True)
class SlotOptions:
    """Launcher options that shape the slots (``hydra.launcher`` keys of the same names, whose
    defaults live in the launcher's config); see ``plan_slots`` for their meaning.

    Checked when made, so every backend plans from valid options.

    Raises:
        FurcateConfigError: an option is invalid (the error names the key, value and fix).
    """

    gpus: Sequence[int | str] | str | None
    jobs_per_gpu: int | str | None
    gpu_mem_per_job_gb: float | None
    max_jobs_per_gpu: int | None
    max_workers: int | None
    cpus_per_job: int | None
    allow_cpu: bool
    gpu_mem_margin_gb: float = 0.5
    auto_min_gain: float = 0.05
    # GPUs of one machine per job (its ranks'); each slot then holds that many GPUs whole
    gpus_per_job: int = 1

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def auto(self) -> bool:
        """Whether each GPU's job count is learned while the sweep runs (``jobs_per_gpu=auto``)."""
        return self.jobs_per_gpu == AUTO


def _validate(options: SlotOptions) -> None:
    """Check every option (the GPUs named too), naming the key, the value and the fix."""
    fixes = {
        "jobs_per_gpu": "set it to 1 or more, auto (learn it from measured GPU memory), or "
        "null for one job per GPU",
        "max_jobs_per_gpu": "set it to 1 or more, or null for as many as the cores can drive",
        "max_workers": "set it to 1 or more, or null for no cap",
        "cpus_per_job": "set it to 1 or more, or null to leave cores unpinned",
    }
    for name, fix in fixes.items():
        value = getattr(options, name)
        if value is None:
            continue
        if name == "jobs_per_gpu" and options.auto:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problem = "must be a positive integer" + (" or auto" if name == "jobs_per_gpu" else "")
            raise FurcateConfigError(f"hydra.launcher.{name}", value, problem, fix)
    mem = options.gpu_mem_per_job_gb
    if mem is not None and (
        isinstance(mem, bool) or not isinstance(mem, int | float) or not 0 < mem < math.inf
    ):
        raise FurcateConfigError(
            "hydra.launcher.gpu_mem_per_job_gb",
            mem,
            "must be a positive number of GiB",
            "set it to the GPU memory one job needs, e.g. 4.5, or null to use jobs_per_gpu",
        )
    margin = options.gpu_mem_margin_gb
    if (
        isinstance(margin, bool)
        or not isinstance(margin, int | float)
        or not 0 <= margin < math.inf
    ):
        raise FurcateConfigError(
            "hydra.launcher.gpu_mem_margin_gb",
            margin,
            "must be a number of GiB, 0 or more",
            "set it to the GPU memory to keep free beyond the jobs' measured peaks, e.g. 0.5",
        )
    gain = options.auto_min_gain
    if isinstance(gain, bool) or not isinstance(gain, int | float) or not 0 <= gain < 10:
        raise FurcateConfigError(
            "hydra.launcher.auto_min_gain",
            gain,
            "must be a fraction, 0 or more (below 10)",
            "set it to the least share of a GPU's rate one more job must add, e.g. 0.05",
        )
    if isinstance(options.jobs_per_gpu, str) and not options.auto:
        raise FurcateConfigError(
            "hydra.launcher.jobs_per_gpu",
            options.jobs_per_gpu,
            "must be a positive integer or auto",
            "set it to 1 or more, auto (learn it from measured GPU memory), or null for one "
            "job per GPU",
        )
    if mem is not None and options.jobs_per_gpu is not None and not options.auto:
        raise FurcateConfigError(
            "hydra.launcher.jobs_per_gpu",
            options.jobs_per_gpu,
            f"cannot be combined with hydra.launcher.gpu_mem_per_job_gb={mem!r}",
            "pick one: jobs_per_gpu for a fixed count per GPU, or gpu_mem_per_job_gb to size "
            "by free memory, and set the other to null (jobs_per_gpu=auto takes "
            "gpu_mem_per_job_gb as where each GPU starts)",
        )
    if not isinstance(options.allow_cpu, bool):
        raise FurcateConfigError(
            "hydra.launcher.allow_cpu",
            options.allow_cpu,
            "must be true or false",
            "set hydra.launcher.allow_cpu=true or false",
        )
    explicit_gpus(options.gpus)
    _check_gpus_per_job(options)


def _check_gpus_per_job(options: SlotOptions) -> None:
    """A whole number of GPUs, 1 or more; above 1 each GPU runs one job, so nothing that
    shares a GPU between jobs goes with it."""
    key, n = "hydra.launcher.gpus_per_job", options.gpus_per_job
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise FurcateConfigError(
            key,
            n,
            "must be a whole number of GPUs, 1 or more",
            "set it to the GPUs one job trains on (its Trainer's devices), e.g. 2, or 1",
        )
    if n == 1:
        return
    sharing = {
        "jobs_per_gpu": options.jobs_per_gpu if options.jobs_per_gpu not in (None, 1) else None,
        "gpu_mem_per_job_gb": options.gpu_mem_per_job_gb,
    }
    for name, value in sharing.items():
        if value is not None:
            raise FurcateConfigError(
                key,
                n,
                f"a job of several GPUs has them to itself, and hydra.launcher.{name}="
                f"{value!r} shares a GPU between jobs",
                f"set hydra.launcher.{name}=null to give each job {n} whole GPUs, or "
                "gpus_per_job=1 to share GPUs between jobs of one GPU",
            )


def explicit_gpus(gpus: object) -> list[str] | None:
    """Normalise ``gpus`` to distinct device ids; None means discover them."""
    if gpus is None:
        return None
    fix = "give distinct GPU indices or GPU-/MIG- UUIDs, e.g. gpus=[0,1] or gpus='0,1'"
    if isinstance(gpus, str):
        entries: list[object] = [] if not gpus.strip() else list(gpus.split(","))
    elif isinstance(gpus, Sequence) and not isinstance(gpus, bytes):
        entries = list(gpus)
    else:
        raise FurcateConfigError(
            "hydra.launcher.gpus", gpus, "must be a list or a comma-separated string", fix
        )
    devices: list[str] = []
    for entry in entries:
        device = normalize_device_id(entry)
        if device is None:
            problem = f"entry {entry!r} is neither a GPU index (0, 1, ...) nor a GPU-/MIG- UUID"
            raise FurcateConfigError("hydra.launcher.gpus", gpus, problem, fix)
        if device in devices:
            problem = f"GPU {device!r} is listed twice"
            raise FurcateConfigError(
                "hydra.launcher.gpus", gpus, problem, fix + "; use jobs_per_gpu for more jobs"
            )
        devices.append(device)
    return devices
