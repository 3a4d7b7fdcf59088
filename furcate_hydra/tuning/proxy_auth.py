"""The study proxy's token, checked by its server and sent by each job, and its TLS channels.

    job: every call ── metadata "authorization: Bearer TOKEN" ──► TokenCheck (server) ──► Optuna
                                                                  └ else UNAUTHENTICATED

Imports gRPC (the ``[ray]`` extra): ``proxy.py`` imports this module only where it serves or
opens a ``grpc://`` study. The token is compared in constant time; a refused peer is logged
once per address, not per call, so a scanner cannot flood the sweeper's log.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from furcate_hydra.said_once import SaidOnce

__all__ = ["TokenCheck", "job_channel", "server_credentials"]

log = logging.getLogger(__name__)

_HEADER = "authorization"  # gRPC metadata keys are lower case
# as Optuna's own client: all of a study's trials may come in one answer
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]
# the method handler gRPC takes for each (request streaming, response streaming)
_HANDLERS: dict[tuple[bool, bool], Callable[..., Any]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _bearer(token: str) -> str:
    return f"Bearer {token}"


class TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]  # gRPC has no type hints
    """Lets through only the calls that carry ``token``; the others end UNAUTHENTICATED
    before Optuna's servicer sees them. Called from the server's threads."""

    def __init__(self, token: str) -> None:
        self._expected = _bearer(token).encode()
        self._warned = SaidOnce()  # peer addresses already logged

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or self._admits(details.invocation_metadata):
            return handler
        refuse = _HANDLERS[(handler.request_streaming, handler.response_streaming)]
        return refuse(self._refuse)

    def _admits(self, metadata: Any) -> bool:
        sent = [value for key, value in metadata or () if key == _HEADER]
        # one header exactly; compare_digest: the time taken tells nothing of the token
        return len(sent) == 1 and hmac.compare_digest(str(sent[0]).encode(), self._expected)

    def _refuse(self, _request: Any, context: Any) -> None:
        address = _address(context.peer())
        if self._warned.first(address):
            log.warning(
                "furcate_optuna: refused a call to the study proxy from %s, which did not send "
                "the sweep's token (later calls from there are refused without a word)",
                address,
            )
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "this Optuna study proxy serves only the jobs of its sweep, which send its token",
        )


def _address(peer: str) -> str:
    """``ipv4:10.0.0.7:51234`` without its port, which each connection changes."""
    head, _, port = peer.rpartition(":")
    return head if head and port.isdigit() else peer


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    """A call's details with the token added (gRPC's own are read-only)."""

    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _SendToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the token to every call, of whichever of the four kinds."""

    def __init__(self, token: str) -> None:
        self._header = (_HEADER, _bearer(token))

    def _with_token(self, details: Any) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._header],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def job_channel(host: str, port: int, token: str | None, cert_pem: bytes | None) -> Any:
    """A channel to the proxy at ``host:port`` sending ``token`` (None: nothing) with each
    call; TLS trusting ``cert_pem`` alone where given, which must name ``host``."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if cert_pem is None:
        channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert_pem)
        channel = grpc.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
    return channel if token is None else grpc.intercept_channel(channel, _SendToken(token))


def server_credentials(cert_pem: bytes, key_pem: bytes) -> Any:
    """The server side of TLS with the certificate (chain) ``cert_pem`` and its key."""
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])
