"""The sweeper's sqlite study served to jobs on other machines through Optuna's gRPC proxy.

    sweeper (this machine) ── sqlite file ◄── StudyProxy (gRPC server, threads of the sweeper)
                                                 ▲ grpc://HOST:PORT
    job on a Ray node ── open_job_storage(url) ──┘ GrpcStorageProxy: report, should_prune

A sqlite file on the launcher's disk cannot be opened by jobs on other machines; Optuna's
storage proxy in front of it can be reached by them, with nothing to install or run beside the
sweep (measured against an RDB server and a journal file in ``bench/optuna_storage.py``). The
proxy lives exactly as long as the sweep. It has no authentication: it listens on one address
of this machine, which should be on the cluster's private network, as Ray's own ports are.

Imports Optuna only (gRPC inside functions, from the ``[ray]`` extra).
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from optuna.storages import BaseStorage

from furcate_hydra.addresses import HostPort
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.tuning.optuna_private import OptunaPrivateMoved, grpc_servicer
from furcate_hydra.tuning.storage import rdb_storage

__all__ = ["GRPC_PREFIX", "StudyProxy", "open_job_storage", "parse_grpc_url"]

GRPC_PREFIX = "grpc://"
# Requests served at once; jobs beyond it wait in gRPC's queue (one call takes milliseconds).
_SERVER_THREADS = 16
# How long a job waits for the sweeper's proxy to answer before its trial fails.
_CONNECT_TIMEOUT_S = 30.0
_GRPC_MISSING = "pip install 'furcate-hydra[ray]' (or grpcio) on this machine and every node"


def parse_grpc_url(url: str) -> tuple[str, int] | None:
    """``grpc://HOST:PORT`` as a pair; None when ``url`` is no such URL."""
    if not url.startswith(GRPC_PREFIX):
        return None
    try:
        address = HostPort.parse(url[len(GRPC_PREFIX) :], "url", "")
    except FurcateConfigError:
        return None
    return address.host, address.port


class StudyProxy:
    """Optuna's gRPC storage proxy in front of the sqlite study at ``url``, started at once.

    ``key`` names the option the address came from, for errors. ``port`` 0 takes a free one;
    ``url`` is what jobs open (``grpc://HOST:PORT``). ``stop`` ends it; in-flight calls get
    ``grace_s`` to finish.

    Raises:
        FurcateConfigError: gRPC is not installed, or the address cannot be bound.
    """

    def __init__(self, storage_url: str, host: str, port: int, key: str) -> None:
        try:
            import grpc
        except ImportError:
            raise FurcateConfigError(
                key,
                f"{host}:{port}",
                "serving the sqlite study to the Ray nodes needs gRPC, which is not installed",
                _GRPC_MISSING,
            ) from None
        try:
            add_servicer, servicer = grpc_servicer()
        except OptunaPrivateMoved as exc:  # a later Optuna moved them
            raise FurcateConfigError(
                key,
                f"{host}:{port}",
                f"Optuna's gRPC proxy cannot be started here ({exc})",
                "use an RDB storage on a database server every node reaches, e.g. "
                "hydra.sweeper.storage=postgresql+psycopg2://USER:PASSWORD@DBHOST/optuna",
            ) from None

        # Optuna's advice for a proxy: the cached storage, which reads finished trials once
        storage: BaseStorage = _cached(rdb_storage(storage_url, create_tables=False))
        # gRPC sets SO_REUSEPORT by default: a port another server holds would be shared
        # silently instead of refused
        server = grpc.server(
            ThreadPoolExecutor(max_workers=_SERVER_THREADS, thread_name_prefix="optuna-proxy"),
            options=[("grpc.so_reuseport", 0)],
        )
        add_servicer(servicer(storage), server)
        shown = f"[{host}]" if ":" in host else host
        try:
            bound = server.add_insecure_port(f"{shown}:{port}")
        except RuntimeError as exc:
            raise FurcateConfigError(
                key,
                f"{host}:{port}",
                f"Optuna's gRPC proxy for the study cannot listen there ({exc})",
                f"set {key}=HOST:PORT to an address of this machine that the Ray nodes reach "
                "and a free port (or HOST alone, for any free port)",
            ) from None
        server.start()
        self._server: Any = server
        self.host, self.port = host, bound
        self.url = f"{GRPC_PREFIX}{shown}:{bound}"

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.stop(grace_s).wait()


def _cached(storage: BaseStorage) -> BaseStorage:
    from optuna.storages import get_storage

    return get_storage(storage)


def open_job_storage(
    url: str, key: str, connect_timeout_s: float = _CONNECT_TIMEOUT_S
) -> BaseStorage:
    """The storage a trial's job reports to: the sweeper's proxy for ``grpc://``, else the
    RDB storage at ``url`` (its tables exist: the sweeper made them). ``key`` names where the
    URL came from, for errors.

    Raises:
        FurcateConfigError: a ``grpc://`` URL that is malformed, gRPC missing, or no proxy
            answering there in time.
    """
    if not url.startswith(GRPC_PREFIX):
        return rdb_storage(url, create_tables=False)
    address = parse_grpc_url(url)
    if address is None:
        raise FurcateConfigError(
            key, url, "is not grpc://HOST:PORT", "the Optuna sweeper sets it; do not edit it"
        )
    try:
        import grpc  # noqa: F401  (GrpcStorageProxy imports it only when it connects)
    except ImportError:
        raise FurcateConfigError(
            key, url, "needs gRPC to reach the sweeper's study", _GRPC_MISSING
        ) from None
    import optuna

    host, port = address
    with warnings.catch_warnings():  # "experimental": nothing a user of the sweep can act on
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        proxy = optuna.storages.GrpcStorageProxy(host=host, port=port)
    try:
        proxy.wait_server_ready(timeout=connect_timeout_s)
    except ConnectionError:
        proxy.close()
        raise FurcateConfigError(
            key,
            url,
            f"no Optuna gRPC proxy answered there within {connect_timeout_s:g} s (the "
            "sweeper serves its study there while the sweep runs)",
            "check that this node reaches that address (a firewall?), or set "
            "hydra.sweeper.storage_proxy=HOST:PORT to an address of the sweeper's machine "
            "that it reaches",
        ) from None
    return proxy
