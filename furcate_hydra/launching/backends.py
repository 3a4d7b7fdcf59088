"""The one place a backend is chosen: its slot plan, its checks, its executor.

LauncherOptions.backend ── local ─► plan_slots (this machine; in a Slurm job its
                        │            allocation's GPUs, and its cores split between slots)
                        │                                        ─► LocalPool
                        └─ ray ───► connect, plan_ray_slots    ─► RayPool (imports Ray)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from furcate_hydra.execution.executor import Executor
from furcate_hydra.execution.forkserver.client import ConsoleOutput
from furcate_hydra.execution.forkserver.protocol import WarmContext
from furcate_hydra.execution.fused_groups import seated
from furcate_hydra.execution.gpu.groups import rank_threads
from furcate_hydra.execution.gpu.packing import GIB, GpuPacking
from furcate_hydra.execution.local_pool import LocalPool
from furcate_hydra.execution.slot_options import SlotOptions
from furcate_hydra.execution.slots import GpuStart, SlotPlan, core_blocks, plan_slots
from furcate_hydra.launching.launcher_options import LauncherOptions
from furcate_hydra.ray_backend.options import Backend, check_store_reachable
from furcate_hydra.store import resolve_tracking_uri

__all__ = ["gpu_packing", "plan_for", "start_executor"]


def plan_for(options: LauncherOptions, cpus: Sequence[int] | None = None) -> SlotPlan:
    """The slots of the chosen backend; with Ray, after joining the cluster. ``cpus``: the
    cores local slots share (a Slurm allocation's); None: this process's affinity.

    Raises:
        FurcateConfigError: a bad option, Ray missing or unreachable, or a store the
            cluster's nodes cannot reach.
    """
    if options.backend is Backend.LOCAL:
        return seated(_local_plan(options, cpus), options.pool.fuse_max)
    if options.backend is Backend.SLURM:
        raise ValueError("backend=slurm submits allocations; it plans no slots of its own")
    if options.store.enabled:
        tracking = resolve_tracking_uri(options.store.tracking_uri)
        check_store_reachable(tracking.source, tracking.uri, options.ray)
    from furcate_hydra.ray_backend.cluster import connect, plan_ray_slots

    ray = connect(options.ray, log_to_driver=options.pool.echo_output)
    return plan_ray_slots(options.slots, options.ray, ray)


def _local_plan(options: LauncherOptions, cpus: Sequence[int] | None) -> SlotPlan:
    """This machine's slots; in a Slurm allocation its cores are split between them."""
    plan = plan_slots(options.slots, available_cpus=cpus)
    if cpus is None or options.slots.cpus_per_job is not None:
        return plan
    # an allocation's cores are split between its slots, as its GPUs are: no option to set
    share = len(cpus) // len(plan.slots)
    if share < 1:
        return plan
    blocks = core_blocks(sorted(cpus), len(plan.slots), share)
    # a job of several GPUs: its ranks share its cores (gpus_per_job means nothing on CPU)
    threads = rank_threads(share, len(plan.slots[0].devices) or 1)
    slots = tuple(
        replace(slot, cpus=block, threads=threads)
        for slot, block in zip(plan.slots, blocks, strict=True)
    )
    return replace(plan, slots=slots)


def gpu_packing(plan: SlotPlan, options: SlotOptions) -> GpuPacking | None:
    """How many jobs each GPU of a local plan runs at a time: learned under
    ``jobs_per_gpu=auto``, the plan's count otherwise (lowered by an out-of-memory beside
    other jobs); None for CPU plans and Ray's (whose slots name no device: Ray places them)."""
    per_gpu = plan.slots_per_gpu()
    if not per_gpu:
        return None
    margin = int(options.gpu_mem_margin_gb * GIB)
    if plan.packing is None:
        fixed = {device: GpuStart(count, 0) for device, count in per_gpu.items()}
        return GpuPacking(fixed, per_gpu, margin, grows=False)
    return GpuPacking(plan.packing, per_gpu, margin, min_gain=options.auto_min_gain)


def start_executor(
    plan: SlotPlan,
    context: bytes,
    options: LauncherOptions,
    output: ConsoleOutput | None,
    warm: Callable[[], WarmContext | None] | None = None,
    packing: GpuPacking | None = None,
    sweep_dir: Path | None = None,
) -> Executor:
    """The executor that runs the session's jobs on ``plan`` (made by ``plan_for``). It
    starts nothing until it is asked to (``start``, ``wait_ready``, ``submit``). ``warm``: what
    a local fork server that is a fork of this process starts jobs from (see ``LocalPool``).
    ``packing``: ``gpu_packing``'s, for the local pool; ``sweep_dir``: where its MPS daemon's
    pipe and logs go."""
    if options.backend is Backend.LOCAL:
        return LocalPool(plan, context, options.pool, output, warm, packing, sweep_dir)
    from furcate_hydra.ray_backend.cluster import RaySlotPlan, import_ray
    from furcate_hydra.ray_backend.pool import RayPool

    if not isinstance(plan, RaySlotPlan):
        raise TypeError(f"backend=ray needs a RaySlotPlan, got {type(plan).__name__}")
    return RayPool(
        plan, context, options.pool, import_ray(), options.ray.start_timeout_s, owns_ray=True
    )
