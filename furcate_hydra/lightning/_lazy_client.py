"""An MLflow client that a DDP rank other than 0 never builds.

Lightning's ``MLFlowLogger.__init__`` (both namespaces) builds ``MlflowClient(tracking_uri)``
in every rank: MLflow's store is made then (an engine, its schema checked, a connection to
the sqlite file), ~0.1-0.3 s of each rank's start. Only rank 0 uses it: the logger's
``experiment`` is a ``rank_zero_experiment`` and its log calls are ``rank_zero_only``. While a
rank other than 0 builds an ``MLFlowLogger`` (``client_for_this_rank``), the ``MlflowClient``
that ``__init__`` looks up in ``mlflow.tracking`` is ``ClientOnFirstUse``, which builds itself
the first time anything of it is read (never, in such a rank). Another thread of that rank
that makes a client meanwhile gets one too: the same client, built when it is first used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlflow.tracking
from lightning_utilities.core.rank_zero import rank_zero_only
from mlflow.tracking import MlflowClient

__all__ = ["ClientOnFirstUse", "client_for_this_rank"]

_ARGUMENTS = "_furcate_arguments"


class ClientOnFirstUse(MlflowClient):
    """An ``MlflowClient`` that builds itself (its store) the first time it is used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # no store yet: MlflowClient.__init__ runs on the first use
        self.__dict__[_ARGUMENTS] = (args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # only what the instance lacks gets here: its attributes, before it is built
        arguments = self.__dict__.pop(_ARGUMENTS, None)
        if arguments is None or name.startswith("__"):  # copy and pickle probe dunders
            if arguments is not None:
                self.__dict__[_ARGUMENTS] = arguments
            raise AttributeError(name)
        args, kwargs = arguments
        MlflowClient.__init__(self, *args, **kwargs)
        return getattr(self, name)


@contextmanager
def client_for_this_rank() -> Iterator[None]:
    """For an ``MLFlowLogger`` built in the block: a client built on first use in a rank other
    than 0 (``rank_zero_only.rank``, which Lightning's import set from LOCAL_RANK); the usual
    one in rank 0."""
    if not getattr(rank_zero_only, "rank", 0):
        yield
        return
    tracking: Any = mlflow.tracking
    previous = tracking.MlflowClient
    tracking.MlflowClient = ClientOnFirstUse
    try:
        yield
    finally:
        tracking.MlflowClient = previous
