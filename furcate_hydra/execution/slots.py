"""Slot planning: split the machine's GPUs and cores into slots that each run one job at a time."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu.devices import (
    GpuProbe,
    InstalledGpu,
    NvmlProbe,
    parse_cuda_visible_devices,
)
from furcate_hydra.execution.gpu.groups import group_devices, rank_threads, slot_devices
from furcate_hydra.execution.slot_env import cuda_env, slot_env
from furcate_hydra.execution.slot_options import AUTO, SlotOptions, explicit_gpus

__all__ = [
    "GpuStart",
    "Slot",
    "SlotPlan",
    "core_blocks",
    "cores_per_gpu",
    "jobs_on_gpu",
    "plan_slots",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """One place a job can run: a GPU, several (``gpus_per_job``) or none, optionally pinned
    cores and a thread count.

    Attributes:
        device: The slot's GPU, or its GPUs as ``CUDA_VISIBLE_DEVICES`` lists them ("0,1",
            see ``gpu_groups``); None on CPU.
        threads: Threads each of the job's processes (each rank) runs.
        home: The slot whose seat this is (``execution.fused_groups.seated``).
    """

    index: int
    device: str | None
    cpus: tuple[int, ...] | None
    threads: int | None
    # a seat of a slot (``fuse=auto``: a fused group's jobs, each its own process): the slot's
    # index; None: a slot of its own
    home: int | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        """The slot's GPU ids, each alone (none on CPU)."""
        return slot_devices(self.device)

    def env(self) -> dict[str, str]:
        """Return variables to set in the job's environment before anything initialises CUDA."""
        return {**cuda_env(self.device), **slot_env(self.index, len(self.devices), self.threads)}


@dataclass(frozen=True)
class GpuStart:
    """Where ``jobs_per_gpu=auto`` starts on one GPU: its open slots, its memory budget."""

    jobs: int
    budget_bytes: int


@dataclass(frozen=True)
class SlotPlan:
    """The slots to run jobs on and where their devices came from.

    Attributes:
        slots: Slots in dispatch order, ``slots[i].index == i``.
        source: "explicit", "CUDA_VISIBLE_DEVICES", "NVML" or "cpu".
        reason: Why the plan is on CPU (empty for GPU plans); used by ``describe``.
        packing: With ``jobs_per_gpu=auto``: per GPU, how many of its slots are open at the
            start and the memory its jobs may fill (free at planning, bytes); ``slots`` then
            holds every slot a GPU may open (``max_jobs_per_gpu``, else what the cores can
            drive). None: all slots open.
        unused: The GPUs no slot has (``gpus_per_job`` does not divide them), in words.
        seats_per_slot: With ``fuse=auto``, the jobs of a fused group each slot runs at once
            (``execution.fused_groups.seated``): ``slots`` holds every seat.
    """

    slots: tuple[Slot, ...]
    source: str
    reason: str = ""
    packing: Mapping[str, GpuStart] | None = None
    unused: str = ""
    seats_per_slot: int = 1

    @property
    def on_cpu(self) -> bool:
        """Whether the jobs run without a GPU."""
        return self.source == "cpu"

    def slots_per_gpu(self) -> dict[str, int]:
        """Each GPU of the plan (in the order its first slot comes) and how many slots it has."""
        counts: dict[str, int] = {}
        for slot in self.slots:
            if slot.device is not None:
                counts[slot.device] = counts.get(slot.device, 0) + 1
        return counts

    def describe(self) -> str:
        """Summarise the plan in one log line."""
        text = self._describe_slots()
        if self.seats_per_slot > 1:
            text += f"; fused groups of up to {self.seats_per_slot} jobs per slot"
        return text

    def _describe_slots(self) -> str:
        n = len(self.slots) // self.seats_per_slot
        if self.on_cpu:
            text = f"{n} CPU slot{_s(n)} (no GPU" + (f": {self.reason})" if self.reason else ")")
        else:
            counts = {d: c // self.seats_per_slot for d, c in self.slots_per_gpu().items()}
            per_gpu = "/".join(str(c) for c in counts.values())
            if len(set(counts.values())) == 1:
                per_gpu = str(next(iter(counts.values())))
            origin = "hydra.launcher.gpus" if self.source == "explicit" else self.source
            gpus = len(self.slots[0].devices) if self.slots else 1
            if gpus > 1:
                per_gpu = f"{gpus} GPUs per job" + (f"; {self.unused}" if self.unused else "")
            elif self.packing is not None:
                starts = {start.jobs for start in self.packing.values()}
                first = "/".join(str(s.jobs) for s in self.packing.values())
                per_gpu = (
                    f"jobs_per_gpu=auto: {next(iter(starts)) if len(starts) == 1 else first} "
                    f"at first, up to {per_gpu} as measured memory and throughput allow"
                )
            else:
                per_gpu += " per GPU"
            named = " ".join(counts) if gpus > 1 else ",".join(counts)
            text = (
                f"{n} slot{_s(n)} on GPU{_s(len(counts) * gpus)} {named} ({per_gpu}, from {origin})"
            )
        slots = self.slots[:: self.seats_per_slot]  # a slot's seats share its cores
        pinned = [slot.cpus for slot in slots if slot.cpus is not None]
        if pinned:
            k = len(pinned[0])
            text += f", {k} pinned core{_s(k)} each"
            cores = {c for block in pinned for c in block}
            if len(cores) < k * len(pinned):
                text += f" (cores shared: {n} slots x {k} > {len(cores)} cores)"
        elif slots and slots[0].threads is not None:
            t = slots[0].threads
            text += f", {t} thread{_s(t)} each"
        return text


def plan_slots(
    options: SlotOptions,
    *,
    environ: Mapping[str, str] | None = None,
    probe: GpuProbe | None = None,
    available_cpus: Sequence[int] | None = None,
) -> SlotPlan:
    """Decide the slots for a sweep.

    Devices come from ``options.gpus``, else ``CUDA_VISIBLE_DEVICES``, else the probe (NVML).
    Named devices must be GPUs NVML lists; without NVML they are taken as named, with a
    warning that they could not be checked. Each GPU gets ``jobs_per_gpu`` slots, or as many as
    fit ``gpu_mem_per_job_gb`` in its free memory. Slots interleave GPUs so that
    ``max_workers`` spreads over all of them. With ``gpus_per_job`` N > 1 the GPUs are taken
    N at a time, in their order, and each group is one slot (``gpu_groups``); its pinned cores
    (``cpus_per_job``: per job) are what its N ranks share. On CPU slots N means nothing: it
    is said in the log and left.

    Args:
        options: The launcher's options.
        environ: Environment to read ``CUDA_VISIBLE_DEVICES`` from; defaults to ``os.environ``.
        probe: GPU discovery and free memory; defaults to ``NvmlProbe()``.
        available_cpus: Cores this process may use; defaults to its affinity mask.

    Raises:
        FurcateConfigError: An option is invalid, a named GPU does not exist, or no GPU was
            found and CPU is not allowed.
    """
    explicit = explicit_gpus(options.gpus)
    environ = os.environ if environ is None else environ
    probe = probe or NvmlProbe()
    cpus = sorted(set(available_cpus)) if available_cpus is not None else _affinity()
    if options.cpus_per_job is not None and options.cpus_per_job > len(cpus):
        raise FurcateConfigError(
            "hydra.launcher.cpus_per_job",
            options.cpus_per_job,
            f"this process may use only {len(cpus)} core{_s(len(cpus))}",
            f"set cpus_per_job to at most {len(cpus)}, or null to leave cores unpinned",
        )
    if explicit is not None:
        devices, source, where = explicit, "explicit", "hydra.launcher.gpus is empty"
        _check_installed(devices, "hydra.launcher.gpus", options.gpus, probe)
    elif "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        devices, source = parse_cuda_visible_devices(value), "CUDA_VISIBLE_DEVICES"
        where = f"CUDA_VISIBLE_DEVICES={value!r}"
        _check_installed(devices, "CUDA_VISIBLE_DEVICES", value, probe)
    else:
        devices, source = probe.device_ids(), "NVML"
        where = "NVML lists none"

    if not devices:
        if not options.allow_cpu:
            problem = f"no GPU was found: {where}"
            if source == "NVML":
                problem += ", and neither hydra.launcher.gpus nor CUDA_VISIBLE_DEVICES is set"
            raise FurcateConfigError(
                "hydra.launcher.allow_cpu",
                False,
                problem,
                "run on a machine with a GPU, name GPUs with hydra.launcher.gpus or "
                "CUDA_VISIBLE_DEVICES, or set hydra.launcher.allow_cpu=true to run on CPU",
            )
        if options.gpus_per_job > 1:
            log.info(
                "furcate: hydra.launcher.gpus_per_job=%d left aside: the jobs run on CPU slots "
                "(%s), and each job's ranks share its cores",
                options.gpus_per_job,
                where,
            )
        n = max(1, len(cpus) // (options.cpus_per_job or 1))
        n = min(n, options.max_workers or n)
        threads = options.cpus_per_job or max(1, len(cpus) // n)
        blocks = core_blocks(cpus, n, options.cpus_per_job)
        slots = tuple(Slot(i, None, blocks[i], threads) for i in range(n))
        return SlotPlan(slots, "cpu", where)

    origin = {"explicit": "hydra.launcher.gpus", "NVML": "NVML"}.get(source, where)
    devices, unused = group_devices(devices, options.gpus_per_job, origin)
    most = options.max_jobs_per_gpu or cores_per_gpu(len(cpus), len(devices), options.cpus_per_job)
    packing = _auto_start(devices, options, probe, most) if options.auto else None
    if packing is not None:
        per_gpu = [most] * len(devices)
    else:
        per_gpu = [_jobs_on(device, options, probe, most) for device in devices]
    order = [
        device
        for round_ in range(max(per_gpu))
        for device, count in zip(devices, per_gpu, strict=True)
        if count > round_
    ]
    order = order[: options.max_workers or len(order)]
    blocks = core_blocks(cpus, len(order), options.cpus_per_job)
    cores = options.cpus_per_job
    per_rank = None if cores is None else rank_threads(cores, options.gpus_per_job)
    slots = tuple(Slot(i, device, blocks[i], per_rank) for i, device in enumerate(order))
    return SlotPlan(slots, source, packing=packing, unused=unused)


def cores_per_gpu(cores: int, gpus: int, cpus_per_job: int | None) -> int:
    """The most jobs one GPU gets where ``max_jobs_per_gpu`` is unset: as many as the cores
    can drive, each job at least one core (``cpus_per_job``'s where set); at least one.
    A job whose Python loop drives its GPU starves without a core of its own."""
    return max(1, cores // max(1, cpus_per_job or 1) // max(1, gpus))


def jobs_on_gpu(
    options: SlotOptions, memory_gib: Callable[[], float], most: int | None = None
) -> int:
    """How many jobs share one GPU: ``jobs_per_gpu`` (default 1), or as many as
    ``gpu_mem_per_job_gb`` fits in ``memory_gib()`` (asked only then), capped by
    ``max_jobs_per_gpu``, else by ``most`` (what the cores can drive, where known). The one
    sizing rule of every backend; with ``jobs_per_gpu=auto``, where a GPU starts.

    Raises:
        FurcateConfigError: what ``memory_gib`` raises when the memory cannot be known.
    """
    gb = options.gpu_mem_per_job_gb
    if gb is None:
        return 1 if options.auto else int(options.jobs_per_gpu or 1)
    fits = max(1, int(memory_gib() // gb))
    cap = options.max_jobs_per_gpu or most
    return fits if cap is None else min(fits, cap)


def _check_installed(devices: list[str], key: str, value: object, probe: GpuProbe) -> None:
    """Refuse a named GPU that NVML does not list: its jobs would train on CPU unawares.

    Without NVML nothing can be checked, so the ids are taken as named and a warning says so.
    MIG instances are not in NVML's list of GPUs and are taken as named.
    """
    named = [device for device in devices if not device.startswith("MIG-")]
    if not named:
        return
    installed = probe.installed()
    if installed is None:
        log.warning(
            "furcate: cannot check that GPU%s %s (%s) exist%s: NVML is not available (no NVIDIA "
            "driver?); a job whose GPU does not exist runs on CPU",
            _s(len(named)),
            ",".join(named),
            key,
            "" if len(named) > 1 else "s",
        )
        return
    for device in named:
        if not any(gpu.is_named_by(device) for gpu in installed):
            raise FurcateConfigError(
                key,
                value,
                f"GPU {device} does not exist: {_nvml_sees(installed)}",
                _installed_fix(key, installed),
            )


def _nvml_sees(installed: list[InstalledGpu]) -> str:
    if not installed:
        return "NVML sees no GPU on this machine"
    listed = ", ".join(str(gpu) for gpu in installed)
    return f"NVML sees {len(installed)} GPU{_s(len(installed))}: {listed}"


def _installed_fix(key: str, installed: list[InstalledGpu]) -> str:
    ids = ",".join(gpu.index for gpu in installed)
    if key == "CUDA_VISIBLE_DEVICES":
        if not installed:
            return "export CUDA_VISIBLE_DEVICES='' (or unset it) to run on CPU"
        return f"export CUDA_VISIBLE_DEVICES with GPUs NVML sees (e.g. {ids}), or unset it"
    if not installed:
        return f"set {key}=[] to run on CPU, or run the sweep where the GPU is"
    return (
        f"name GPUs NVML sees, by index or UUID (e.g. {key}=[{ids}]), or leave {key} unset "
        "to use every GPU"
    )


def _jobs_on(device: str, options: SlotOptions, probe: GpuProbe, most: int) -> int:
    """Number of slots one GPU of this machine gets: sized by its free memory."""

    def free_gib() -> float:
        try:
            return probe.free_memory_bytes(device) / 2**30
        except RuntimeError as exc:
            raise FurcateConfigError(
                "hydra.launcher.gpu_mem_per_job_gb",
                options.gpu_mem_per_job_gb,
                f"the free memory of GPU {device} cannot be read ({exc})",
                "set hydra.launcher.jobs_per_gpu instead",
            ) from exc

    return jobs_on_gpu(options, free_gib, most)


def _auto_start(
    devices: list[str], options: SlotOptions, probe: GpuProbe, most: int
) -> dict[str, GpuStart]:
    """Per GPU, the slots ``jobs_per_gpu=auto`` opens first and the memory its jobs may fill:
    what is free now, before any job of the sweep runs (another user's processes keep theirs).

    Raises:
        FurcateConfigError: a GPU's free memory cannot be read (no NVML, or an id it lacks).
    """
    starts = {}
    for device in devices:
        try:
            free = probe.free_memory_bytes(device)
        except RuntimeError as exc:
            raise FurcateConfigError(
                "hydra.launcher.jobs_per_gpu",
                AUTO,
                f"auto learns how many jobs fit from each GPU's memory, and the memory of "
                f"GPU {device} cannot be read ({exc})",
                "set hydra.launcher.jobs_per_gpu to a number of jobs per GPU (e.g. 2)",
            ) from exc
        starts[device] = GpuStart(jobs_on_gpu(options, functools.partial(_gib, free), most), free)
    return starts


def _gib(size_bytes: int) -> float:
    return size_bytes / 2**30


def core_blocks(cpus: list[int], n: int, per_job: int | None) -> list[tuple[int, ...] | None]:
    """Give slot i the i-th contiguous block of cores, reusing blocks when there are too few."""
    if per_job is None:
        return [None] * n
    # Whole blocks are reused (not a sliding window) so slots that share, share all their cores.
    blocks = len(cpus) // per_job
    return [tuple(cpus[(i % blocks) * per_job : (i % blocks + 1) * per_job]) for i in range(n)]


def _affinity() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _s(count: int) -> str:
    return "" if count == 1 else "s"
