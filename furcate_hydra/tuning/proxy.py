"""The sweeper's sqlite study served to jobs on other machines through Optuna's gRPC proxy.

    sweeper (this machine) ── sqlite file ◄── StudyProxy (gRPC server, threads of the sweeper)
                                                 ▲ grpc://HOST:PORT
    job on a Ray node ── open_job_storage(url) ──┘ GrpcStorageProxy: report, should_prune
                         + the sweep's token on every call, TLS where the sweeper set it up

A sqlite file on the launcher's disk cannot be opened by jobs on other machines; Optuna's
storage proxy in front of it can be reached by them, with nothing to install or run beside the
sweep (measured against an RDB server and a journal file in ``bench/optuna_storage.py``). The
proxy lives exactly as long as the sweep.

Anyone reaching its port could read or change the study, so every call must carry a token the
sweeper makes for each sweep and hands to its trials' jobs in their environment
(``proxy_auth.py``); others are refused UNAUTHENTICATED. Without TLS the token and the study
travel in clear text, and whoever sees that traffic can replay the token: that is for a private
network (as Ray's own ports are). On any other network set the proxy's TLS certificate and key
(``hydra.sweeper.storage_proxy_tls_cert`` / ``_key``); jobs then trust that certificate alone.

Imports Optuna only (gRPC inside functions, from the ``[ray]`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from optuna.storages import BaseStorage

from furcate_hydra import env_vars
from furcate_hydra.addresses import HostPort
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.tuning.optuna_private import (
    OptunaPrivateMoved,
    grpc_proxy_over,
    grpc_servicer,
)
from furcate_hydra.tuning.storage import rdb_storage

__all__ = ["GRPC_PREFIX", "ProxyTls", "StudyProxy", "open_job_storage", "parse_grpc_url"]

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


@dataclass(frozen=True)
class ProxyTls:
    """The proxy's TLS certificate (chain) and its unencrypted key, PEM; the certificate is
    what jobs trust, so it must name the proxy's address."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)  # never in a log or a traceback


class StudyProxy:
    """Optuna's gRPC storage proxy in front of the sqlite study at ``url``, started at once.

    ``key`` names the option the address came from, for errors. ``port`` 0 takes a free one;
    ``url`` is what jobs open (``grpc://HOST:PORT``), with ``job_env`` in their environment:
    every call without ``token`` is refused. ``tls``: served over TLS, else in clear text.
    ``stop`` ends it; in-flight calls get ``grace_s`` to finish.

    Raises:
        FurcateConfigError: gRPC is not installed, or the address cannot be bound.
    """

    def __init__(
        self,
        storage_url: str,
        host: str,
        port: int,
        key: str,
        *,
        token: str,
        tls: ProxyTls | None = None,
    ) -> None:
        if not token:
            raise ValueError("StudyProxy needs a token: an open proxy serves anyone")
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

        from furcate_hydra.tuning.proxy_auth import TokenCheck, server_credentials

        # Optuna's advice for a proxy: the cached storage, which reads finished trials once
        storage: BaseStorage = _cached(rdb_storage(storage_url, create_tables=False))
        # gRPC sets SO_REUSEPORT by default: a port another server holds would be shared
        # silently instead of refused
        server = grpc.server(
            ThreadPoolExecutor(max_workers=_SERVER_THREADS, thread_name_prefix="optuna-proxy"),
            interceptors=[TokenCheck(token)],
            options=[("grpc.so_reuseport", 0)],
        )
        add_servicer(servicer(storage), server)
        shown = f"[{host}]" if ":" in host else host
        try:
            if tls is None:
                bound = server.add_insecure_port(f"{shown}:{port}")
            else:
                credentials = server_credentials(tls.cert_pem, tls.key_pem)
                bound = server.add_secure_port(f"{shown}:{port}", credentials)
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
        self._job_env = {env_vars.OPTUNA_PROXY_TOKEN: token}
        if tls is not None:
            self._job_env[env_vars.OPTUNA_PROXY_TLS_CERT] = tls.cert_pem.decode("ascii")

    def job_env(self) -> dict[str, str]:
        """What a job's ``open_job_storage`` reads beside ``url``: the token (a secret) and,
        under TLS, the certificate to trust."""
        return dict(self._job_env)

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.stop(grace_s).wait()


def _cached(storage: BaseStorage) -> BaseStorage:
    from optuna.storages import get_storage

    return get_storage(storage)


def open_job_storage(
    url: str,
    key: str,
    connect_timeout_s: float = _CONNECT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> BaseStorage:
    """The storage a trial's job reports to: the sweeper's proxy for ``grpc://``, with the
    token and certificate the sweeper put in ``environ`` (default: this process's), else the
    RDB storage at ``url`` (its tables exist: the sweeper made them). ``key`` names where the
    URL came from, for errors.

    Raises:
        FurcateConfigError: a ``grpc://`` URL that is malformed, gRPC missing, no proxy
            answering there in time, or the proxy refusing this job's token.
    """
    if not url.startswith(GRPC_PREFIX):
        return rdb_storage(url, create_tables=False)
    address = parse_grpc_url(url)
    if address is None:
        raise FurcateConfigError(
            key, url, "is not grpc://HOST:PORT", "the Optuna sweeper sets it; do not edit it"
        )
    try:
        import grpc
    except ImportError:
        raise FurcateConfigError(
            key, url, "needs gRPC to reach the sweeper's study", _GRPC_MISSING
        ) from None
    from furcate_hydra.tuning.proxy_auth import job_channel

    env = os.environ if environ is None else environ
    token = env.get(env_vars.OPTUNA_PROXY_TOKEN) or None
    cert = env.get(env_vars.OPTUNA_PROXY_TLS_CERT) or None
    host, port = address
    channel = job_channel(host, port, token, None if cert is None else cert.encode())
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=connect_timeout_s)
    except grpc.FutureTimeoutError:
        ready.cancel()
        channel.close()
        raise _unanswered(key, url, host, connect_timeout_s, tls=cert is not None) from None
    try:
        proxy = grpc_proxy_over(channel, host, port)
    except OptunaPrivateMoved:
        channel.close()
        raise
    try:
        proxy.get_all_studies()  # a refused token is named here, in furcate's words
    except grpc.RpcError as exc:
        proxy.close()
        if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        raise _refused(url, token is not None) from None
    return proxy


def _unanswered(key: str, url: str, host: str, timeout_s: float, tls: bool) -> FurcateConfigError:
    problem = (
        f"no Optuna gRPC proxy answered there within {timeout_s:g} s (the sweeper serves its "
        "study there while the sweep runs)"
    )
    fix = (
        "check that this node reaches that address (a firewall?), or set "
        "hydra.sweeper.storage_proxy=HOST:PORT to an address of the sweeper's machine that it "
        "reaches"
    )
    if tls:
        problem += (
            f"; this job speaks TLS to it, trusting the certificate in "
            f"{env_vars.OPTUNA_PROXY_TLS_CERT}, which fails when that certificate does not "
            f"name {host}"
        )
        fix += (
            f", with a hydra.sweeper.storage_proxy_tls_cert whose subjectAltName names it "
            f"(e.g. IP:{host})"
        )
    return FurcateConfigError(key, url, problem, fix)


def _refused(url: str, sent: bool) -> FurcateConfigError:
    # the value shown is whether the token is set: never the secret itself
    return FurcateConfigError(
        env_vars.OPTUNA_PROXY_TOKEN,
        "set" if sent else "unset",
        f"the sweeper's study proxy at {url} refused this job: "
        + ("its token is not this sweep's" if sent else "it sent no token"),
        "let the Optuna sweeper set it: each sweep makes its own token and gives it to its "
        "trials' jobs, so a job started by hand, or left from an earlier sweep whose address "
        "another sweep now serves, is refused; run the trial from its sweep",
    )
