"""Optuna's private names that furcate uses, each read here and nowhere else.

Public first: a live trial's storage is ``Trial.storage``, a study's id is
``storage.get_study_id_from_name``. What has no public way is read below, and each name has a
test (``tests/test_private_apis.py``) that fails, naming it, when an Optuna release moves it:

    Study._storage        the storage a study was opened with (a FrozenTrial has none)
    Trial._trial_id,      the storage's id of a trial: what every storage call takes;
    FrozenTrial._trial_id   ``number`` is only unique within its study
    optuna.storages._grpc  the gRPC proxy's servicer: the public ``run_grpc_proxy_server``
                           blocks for good, cannot be stopped and does not tell its port
    Study._thread_local,   what ``Study.ask`` does once it has a trial's id, for a trial
    Trial._suggest           created otherwise (``asked``): the sampler's trial list
                           refreshed, the fixed distributions sampled
    GrpcStorageProxy._channel, the gRPC client's channel, and the stub and trial cache made
      ._stub, ._cache      on it (``grpc_proxy_over``): Optuna makes only insecure channels
                           that send no metadata, and the sweep's proxy wants a token (and TLS)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial

from furcate_hydra.errors import PrivateApiMoved

__all__ = [
    "OptunaPrivateMoved",
    "asked",
    "grpc_proxy_over",
    "grpc_servicer",
    "storage_of",
    "trial_id",
]

# The Optuna releases these names were read from (pyproject pins optuna>=4.0).
TESTED = "4.x and 5.0"


class OptunaPrivateMoved(PrivateApiMoved):
    """An Optuna release no longer has a private name furcate reads."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__("Optuna", "optuna", optuna.__version__, TESTED, name, problem)


def _read(obj: object, owner: str, attribute: str) -> Any:
    try:
        return getattr(obj, attribute)
    except AttributeError:
        raise OptunaPrivateMoved(f"{owner}.{attribute}", "no longer has") from None


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` was opened with."""
    storage = _read(study, "Study", "_storage")
    if not isinstance(storage, BaseStorage):
        raise OptunaPrivateMoved("Study._storage", f"holds a {type(storage).__name__} in")
    return storage


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of ``trial`` (live or frozen)."""
    value = _read(trial, type(trial).__name__, "_trial_id")
    if not isinstance(value, int):
        raise OptunaPrivateMoved(f"{type(trial).__name__}._trial_id", "holds no int in")
    return value


def asked(study: optuna.Study, an_id: int, distributions: Mapping[str, BaseDistribution]) -> Trial:
    """The live trial of stored trial ``an_id`` (RUNNING), as ``study.ask(distributions)``
    returns the trial it popped or created: the sampler sees the study's trials as they are
    now (``ask`` drops the list it keeps per thread), then samples each distribution."""
    local = _read(study, "Study", "_thread_local")
    if not hasattr(local, "cached_all_trials"):
        raise OptunaPrivateMoved("Study._thread_local.cached_all_trials", "no longer has")
    local.cached_all_trials = None
    trial = Trial(study, an_id)
    suggest = _read(trial, "Trial", "_suggest")
    for name, distribution in distributions.items():
        suggest(name, distribution)
    return trial


def grpc_servicer() -> tuple[Callable[[Any, Any], None], Callable[[BaseStorage], Any]]:
    """Optuna's gRPC storage service and the function adding it to a ``grpc.server``.

    Raises:
        OptunaPrivateMoved: their modules moved (gRPC itself missing raises ImportError).
    """
    import grpc  # noqa: F401  (missing: ImportError, which callers name as such)

    try:
        from optuna.storages._grpc.auto_generated.api_pb2_grpc import (
            add_StorageServiceServicer_to_server,
        )
        from optuna.storages._grpc.servicer import OptunaStorageProxyService
    except ImportError as exc:
        raise OptunaPrivateMoved("optuna.storages._grpc", f"no longer has ({exc})") from None
    return add_StorageServiceServicer_to_server, OptunaStorageProxyService


def grpc_proxy_over(channel: Any, host: str, port: int) -> optuna.storages.GrpcStorageProxy:
    """Optuna's gRPC storage client (``GrpcStorageProxy``) making every call through
    ``channel``, a ``grpc.Channel`` of the caller's (``host``/``port`` only name the server,
    as the client keeps them); closing the client closes it. A pickled copy connects again
    as Optuna's own client does (insecure, no metadata).

    Raises:
        OptunaPrivateMoved: the client no longer keeps its channel, stub and cache so.
    """
    with warnings.catch_warnings():  # "experimental": nothing a user of the sweep can act on
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        proxy = optuna.storages.GrpcStorageProxy(host=host, port=port)
    own = _read(proxy, "GrpcStorageProxy", "_channel")  # insecure; not connected yet
    stub = _read(proxy, "GrpcStorageProxy", "_stub")
    cache = _read(proxy, "GrpcStorageProxy", "_cache")
    try:
        # the stub binds its calls to a channel when made, and the cache reads through a stub
        new_stub = type(stub)(channel)
        new_cache = type(cache)(new_stub)
    except TypeError as exc:
        own.close()
        name = "GrpcStorageProxy._stub/_cache"
        raise OptunaPrivateMoved(name, f"builds otherwise ({exc})") from None
    proxy._channel = channel
    proxy._stub = new_stub
    proxy._cache = new_cache
    own.close()
    return proxy
