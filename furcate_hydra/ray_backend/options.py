"""``hydra.launcher.backend`` and ``hydra.launcher.ray``, checked before anything starts.

Pure: nothing here imports Ray, so a bad value is refused in milliseconds, with or without it.
"""

from __future__ import annotations

import enum
import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from furcate_hydra.addresses import HostPort, StoreAddress
from furcate_hydra.errors import FurcateConfigError, positive_seconds

__all__ = [
    "Backend",
    "RayOptions",
    "address_toward",
    "check_store_reachable",
    "parse_address",
    "served_by_proxy",
]

BACKEND_KEY = "hydra.launcher.backend"
ADDRESS_KEY = "hydra.launcher.ray.address"
# Where the store's data lives on the launcher's disk: nodes of another machine cannot open it.
_LOCAL_SCHEMES = ("sqlite", "file", "")
# Optuna's storages that are files on one machine's disk (a sqlite one the sweeper serves).
_LOCAL_STORAGE_PREFIXES = ("journal:", "file:")
PROXY_KEY = "hydra.sweeper.storage_proxy"


class Backend(enum.Enum):
    LOCAL = "local"  # slots on this machine, one warm fork server
    RAY = "ray"  # slots from a Ray cluster's resources, a warm fork server per slot actor
    SLURM = "slurm"  # allocations submitted with sbatch, each running the sweep locally

    @classmethod
    def parse(cls, value: object) -> Backend:
        for backend in cls:
            if value == backend.value:
                return backend
        allowed = ", ".join(b.value for b in cls)
        raise FurcateConfigError(
            BACKEND_KEY,
            value,
            f"must be one of {allowed}",
            f"set {BACKEND_KEY}=local (this machine's GPUs, or a Slurm allocation's), "
            f"{BACKEND_KEY}=ray (a Ray cluster; pip install 'furcate-hydra[ray]') or "
            f"{BACKEND_KEY}=slurm (allocations submitted with sbatch)",
        )


@dataclass(frozen=True)
class RayOptions:
    """``hydra.launcher.ray``: which cluster, and what its workers need."""

    # "auto", "host:port" or "ray://host:port"; None starts a Ray instance on this machine
    address: str | None = None
    namespace: str | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
    # memory of one GPU of the cluster: with gpu_mem_per_job_gb, the GPU share a job asks for
    gpu_memory_gb: float | None = None
    # how long the slot actors (and their warm fork servers) may take to start
    start_timeout_s: float = 600.0

    @property
    def on_this_machine(self) -> bool:
        """Whether every node is this machine: a Ray instance the launcher starts itself."""
        return self.address is None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> RayOptions:
        address = options.get("address") or None
        if address is not None:
            parse_address(address)
        namespace = options.get("namespace") or None
        if namespace is not None and not isinstance(namespace, str):
            raise FurcateConfigError(
                "hydra.launcher.ray.namespace",
                namespace,
                "must be a string",
                "set hydra.launcher.ray.namespace=my_sweeps, or leave it unset",
            )
        runtime_env = options.get("runtime_env") or {}
        if not isinstance(runtime_env, Mapping):
            raise FurcateConfigError(
                "hydra.launcher.ray.runtime_env",
                runtime_env,
                "must be a mapping (Ray's runtime_env)",
                "set e.g. hydra.launcher.ray.runtime_env={working_dir:.}",
            )
        memory = options.get("gpu_memory_gb")
        if memory is not None and (
            isinstance(memory, bool)
            or not isinstance(memory, int | float)
            or not 0 < memory < math.inf
        ):
            raise FurcateConfigError(
                "hydra.launcher.ray.gpu_memory_gb",
                memory,
                "must be a positive number of GiB",
                "set it to the memory of one of the cluster's GPUs, e.g. 80",
            )
        timeout = positive_seconds(
            "hydra.launcher.ray.start_timeout_s",
            options.get("start_timeout_s", cls.start_timeout_s),
            600,
        )
        return cls(
            address=address,
            namespace=namespace,
            runtime_env=dict(runtime_env),
            gpu_memory_gb=None if memory is None else float(memory),
            start_timeout_s=timeout,
        )


def parse_address(address: object) -> tuple[str, int] | None:
    """``host:port`` as a pair; None for ``auto`` and ``ray://`` addresses (Ray checks those).

    Raises:
        FurcateConfigError: neither ``auto``, ``host:port`` nor ``ray://host:port``.
    """
    fix = (
        f"set {ADDRESS_KEY}=auto (the cluster this machine belongs to), "
        f"{ADDRESS_KEY}=HOST:PORT (the head's GCS port, 6379 by default), or leave it unset "
        "to start Ray on this machine"
    )
    if not isinstance(address, str):
        raise FurcateConfigError(ADDRESS_KEY, address, "must be a string", fix)
    if address == "auto" or address.startswith("ray://"):
        return None
    parsed = HostPort.parse(address, ADDRESS_KEY, fix)
    return parsed.host, parsed.port


def served_by_proxy(key: str, uri: str, ray: RayOptions) -> bool:
    """Whether the sweeper must serve its Optuna storage ``uri`` to the cluster's nodes: a
    sqlite file on this machine, and jobs that may run on others."""
    return key.endswith("storage") and not ray.on_this_machine and StoreAddress.parse(uri).is_sqlite


def check_store_reachable(key: str, uri: str, ray: RayOptions) -> None:
    """Refuse a store that is a file on this machine when jobs may run on other machines.

    ``key`` names the setting the URI came from. With a Ray instance of this machine only
    (``address`` unset) a local file serves every job, as with the local backend. A sqlite
    Optuna storage is not refused: the sweeper serves it to the nodes (``served_by_proxy``).

    Raises:
        FurcateConfigError: the store is a local file and the cluster may span machines.
    """
    if ray.on_this_machine or served_by_proxy(key, uri, ray):
        return
    if key.endswith("storage"):  # an Optuna storage
        local = uri.startswith(_LOCAL_STORAGE_PREFIXES) or "://" not in uri
        fix = (
            f"set {key}=sqlite:///optuna.db (the sweeper serves it to the nodes through "
            "Optuna's gRPC proxy), or an RDB storage on a database server every node reaches, "
            f"e.g. {key}=postgresql+psycopg2://USER:PASSWORD@DBHOST/optuna, "
            f"or leave {ADDRESS_KEY} unset to run on this machine only"
        )
    else:
        local = StoreAddress.parse(uri).scheme in _LOCAL_SCHEMES
        fix = (
            "run `mlflow server --backend-store-uri postgresql://... --host 0.0.0.0 --port 5000` "
            f"on a machine every node reaches and set {key}=http://THAT_HOST:5000, "
            f"or leave {ADDRESS_KEY} unset to run on this machine only"
        )
    if local:
        raise FurcateConfigError(
            key,
            uri,
            f"is a file on this machine's disk, which jobs on other nodes of the Ray cluster "
            f"at {ray.address} cannot reach",
            fix,
        )


def address_toward(ray: RayOptions) -> str:
    """This machine's address on the route to the cluster's head: where its nodes reach us.

    A UDP socket "connected" to the head picks the route and sends nothing.

    Raises:
        FurcateConfigError: the head's host is not known from ``address`` (``auto``), or no
            route leads there; it names ``hydra.sweeper.storage_proxy``, which says instead.
    """
    address = ray.address or ""
    head = address[len("ray://") :] if address.startswith("ray://") else address
    fix = (
        f"set {PROXY_KEY}=HOST:PORT (or HOST alone, for any free port): an address of this "
        "machine that every node of the Ray cluster reaches"
    )
    unset = "unset: the sweeper serves its sqlite study to the Ray nodes through Optuna's gRPC "
    try:
        head_address = HostPort.parse(head, ADDRESS_KEY, fix)
    except FurcateConfigError:
        raise FurcateConfigError(
            PROXY_KEY,
            None,
            f"{unset}proxy, and {ADDRESS_KEY}={address} names no head from which to find the "
            "address at which the nodes reach this machine",
            fix,
        ) from None
    try:
        family = socket.AF_INET6 if ":" in head_address.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((head_address.host, head_address.port))
            local: str = probe.getsockname()[0]
    except OSError as exc:
        raise FurcateConfigError(
            PROXY_KEY,
            None,
            f"{unset}proxy, and no route leads from this machine to the head at {address} ({exc})",
            fix,
        ) from None
    return local
