"""Connect to Ray and turn the cluster's resources into slots.

A slot is one long-lived actor holding ``1 / jobs_per_gpu`` of a GPU (or the share that
``gpu_mem_per_job_gb`` of ``ray.gpu_memory_gb`` implies), or ``gpus_per_job`` whole GPUs of
one node, ``cpus_per_job`` CPUs, or, with no GPU in the cluster, ``cpus_per_job`` (default 1)
CPUs; ``max_workers`` caps their number.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from furcate_hydra.errors import FurcateConfigError, first_line
from furcate_hydra.execution.gpu.groups import rank_threads
from furcate_hydra.execution.slot_options import SlotOptions
from furcate_hydra.execution.slots import Slot, SlotPlan, jobs_on_gpu
from furcate_hydra.ray_backend.options import ADDRESS_KEY, BACKEND_KEY, RayOptions, parse_address

__all__ = ["USAGE_STATS_VAR", "RaySlotPlan", "connect", "import_ray", "plan_ray_slots"]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RaySlotPlan(SlotPlan):
    """Slots as Ray resource requests; the GPUs themselves are chosen by Ray, per actor."""

    gpus_per_slot: float = 0.0  # a share of one GPU, or gpus_per_job whole ones
    cpus_per_slot: float = 0.0
    address: str = "a Ray instance on this machine"
    nodes: int = 1

    def describe(self) -> str:
        n = len(self.slots)
        gpus = self.gpus_per_slot
        each = f"{gpus:g} GPU{'s' if gpus > 1 else ''}" if gpus else "no GPU"
        if self.cpus_per_slot:
            each += f", {self.cpus_per_slot:g} CPU"
        return (
            f"{n} Ray slot{'' if n == 1 else 's'} ({each} each) on {self.nodes} "
            f"node{'' if self.nodes == 1 else 's'} of {self.address}"
        )


# Ray's own switch for its usage stats, read by the processes of an instance it starts
USAGE_STATS_VAR = "RAY_USAGE_STATS_ENABLED"


def import_ray() -> ModuleType:
    """Ray, or an error that says how to install it."""
    # Jobs' output is echoed through Ray's log forwarding, which by default folds lines that
    # several jobs print alike into "[repeated 4x across cluster]": show each job's, as the
    # local backend does (read once, when Ray is first imported; a user's setting wins).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        import ray
    except ImportError as exc:
        raise FurcateConfigError(
            BACKEND_KEY,
            "ray",
            f"Ray is not installed in this Python ({exc})",
            "pip install 'furcate-hydra[ray]' (on the launcher's machine and every node), "
            f"or set {BACKEND_KEY}=local",
        ) from None
    return ray


def connect(options: RayOptions, log_to_driver: bool) -> ModuleType:
    """Join the cluster at ``options.address`` (or start Ray here); returns the ``ray`` module.

    Raises:
        FurcateConfigError: Ray is missing, or nothing answers at the address.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    host_port = None if options.address is None else parse_address(options.address)
    if host_port is not None:
        _check_answers(options.address, *host_port)
    kwargs: dict[str, Any] = {
        "address": options.address,
        "namespace": options.namespace,
        "runtime_env": options.runtime_env or None,
        "log_to_driver": log_to_driver,
    }
    if options.address is None:
        kwargs.update(include_dashboard=False)
        # The instance started here is the sweep's, not one the user set up: Ray's usage
        # stats (on unless disabled) would ask the cloud metadata address (169.254.169.254)
        # and report to Ray's servers. RAY_USAGE_STATS_ENABLED=1 in the environment keeps them.
        os.environ.setdefault(USAGE_STATS_VAR, "0")
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        raise FurcateConfigError(
            ADDRESS_KEY,
            options.address,
            f"Ray could not connect to a cluster there ({first_line(exc)})",
            "start the cluster first (`ray start --head` on its head node), check the "
            f"address with `ray status --address=...`, or leave {ADDRESS_KEY} unset to start "
            "Ray on this machine",
        ) from None
    # Ray authenticates nothing: whoever reaches its ports can run code as the cluster's user
    log.info(
        "furcate: Ray's own ports (%s) take work from whoever reaches them: furcate relies on "
        "that network being private to the sweep's user (docs: Security)",
        options.address or "the Ray instance started on this machine",
    )
    return ray


def plan_ray_slots(options: SlotOptions, ray_options: RayOptions, ray: Any) -> RaySlotPlan:
    """Slots from the resources the cluster has now.

    Raises:
        FurcateConfigError: an option has no meaning on Ray, or the cluster lacks what one
            slot needs.
    """
    if options.gpus is not None:
        raise FurcateConfigError(
            "hydra.launcher.gpus",
            options.gpus,
            "names GPUs of this machine, but with backend=ray Ray chooses each job's GPU",
            "leave hydra.launcher.gpus unset, and size slots with jobs_per_gpu or "
            "gpu_mem_per_job_gb",
        )
    resources = ray.cluster_resources()
    gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    where = ray_options.address or "a Ray instance on this machine"
    if gpus >= 1:
        if options.gpus_per_job > 1:
            share = float(options.gpus_per_job)
            count = _whole_gpu_slots(ray, options.gpus_per_job, where, resources)
        else:
            share = _gpu_share(options, ray_options)
            count = int(gpus / share + 1e-9)
        # Without cpus_per_job a slot holds no CPU: as locally, the GPU is what is shared out.
        cpus_each = float(options.cpus_per_job or 0)
    elif options.allow_cpu:
        if options.gpus_per_job > 1:
            log.info(
                "furcate: hydra.launcher.gpus_per_job=%d left aside: the Ray cluster has no "
                "GPU, and each job's ranks share its CPUs",
                options.gpus_per_job,
            )
        share, cpus_each = 0.0, float(options.cpus_per_job or 1)
        count = int(cpus // cpus_each)
    else:
        raise FurcateConfigError(
            "hydra.launcher.allow_cpu",
            False,
            f"the Ray cluster at {where} has no GPU (resources: {_short(resources)})",
            "add nodes with GPUs (`ray start ... --num-gpus=N`), or set "
            "hydra.launcher.allow_cpu=true to run on CPU slots",
        )
    if cpus_each:
        count = min(count, int(cpus // cpus_each))
    count = min(count, options.max_workers or count)
    if count < 1:
        raise FurcateConfigError(
            "hydra.launcher.cpus_per_job",
            options.cpus_per_job,
            f"no slot fits the Ray cluster at {where} (resources: {_short(resources)})",
            "lower cpus_per_job (or leave it unset), or add nodes to the cluster",
        )
    cores = options.cpus_per_job  # a job of several GPUs: its ranks share them
    threads = None if cores is None else rank_threads(cores, max(1, int(share)))
    slots = tuple(Slot(i, None, None, threads) for i in range(count))
    return RaySlotPlan(
        slots, "ray", "", gpus_per_slot=share, cpus_per_slot=cpus_each, address=where, nodes=nodes
    )


def _whole_gpu_slots(ray: Any, per_job: int, where: str, resources: dict[str, Any]) -> int:
    """Slots of ``per_job`` GPUs each: a job's GPUs are on one node (Ray places an actor on
    one), so each node gives its own GPUs // ``per_job``.

    Raises:
        FurcateConfigError: no node has ``per_job`` GPUs.
    """
    on_nodes = [
        int(float(node.get("Resources", {}).get("GPU", 0)))
        for node in ray.nodes()
        if node.get("Alive")
    ]
    count = sum(gpus // per_job for gpus in on_nodes)
    if count < 1:
        raise FurcateConfigError(
            "hydra.launcher.gpus_per_job",
            per_job,
            f"a job's GPUs must be on one node, and no node of the Ray cluster at {where} has "
            f"{per_job} (GPUs per node: {', '.join(map(str, on_nodes)) or 'none'}; "
            f"{_short(resources)})",
            f"set gpus_per_job to at most {max(on_nodes, default=1) or 1}, or add a node with "
            f"{per_job} GPUs (`ray start ... --num-gpus={per_job}`)",
        )
    return count


def _gpu_share(options: SlotOptions, ray_options: RayOptions) -> float:
    """The fraction of one GPU a job asks Ray for (``options`` were checked when made)."""

    def gpu_memory_gib() -> float:
        if ray_options.gpu_memory_gb is None:
            raise FurcateConfigError(
                "hydra.launcher.gpu_mem_per_job_gb",
                options.gpu_mem_per_job_gb,
                "with backend=ray the launcher cannot read the GPUs' memory on other nodes",
                "also set hydra.launcher.ray.gpu_memory_gb to the memory of one of the "
                "cluster's GPUs, or use hydra.launcher.jobs_per_gpu",
            )
        return ray_options.gpu_memory_gb

    return 1.0 / jobs_on_gpu(options, gpu_memory_gib)


def _check_answers(address: str | None, host: str, port: int) -> None:
    # Ray retries an address that does not answer for a long while; say so in seconds.
    try:
        with contextlib.closing(socket.create_connection((host, port), _CONNECT_TIMEOUT_S)):
            pass
    except OSError as exc:
        raise FurcateConfigError(
            ADDRESS_KEY,
            address,
            f"nothing answers at {host}:{port} ({exc.strerror or exc})",
            "start the cluster's head there (`ray start --head --port=PORT`), fix the "
            f"address, or leave {ADDRESS_KEY} unset to start Ray on this machine",
        ) from None


def _short(resources: dict[str, Any]) -> str:
    keys = ("CPU", "GPU")
    return ", ".join(f"{k}={resources.get(k, 0):g}" for k in keys)
