"""Whether this process has an MLflow store open: a fork of it must then not serve forks."""

from __future__ import annotations

import sys

__all__ = ["database_opened", "note_store_opened"]

# Whether a RunStore, or a sweeper, opened an MLflow client in this process (database_opened).
_opened = False
# Where MLflow caches the stores it has opened (in the versions furcate has met), by module.
_MLFLOW_STORE_CACHES = (
    ("mlflow.tracking._tracking_service.utils", "_get_sqlalchemy_store"),
    (
        "mlflow.tracking._tracking_service.registry",
        "TrackingStoreRegistry._get_store_with_resolved_uri",
    ),
)


def database_opened() -> bool:
    """Whether this process has opened an MLflow store: by a launcher before (a RunStore), by
    a sweeper (``note_store_opened``), or by other code (MLflow keeps its stores, with their
    open connections, in a cache).

    A fork of this process must then not be the fork server: its jobs would find the cached
    store and use connections the launcher uses too, which sqlite forbids across a fork.
    """
    if _opened:
        return True
    for module, path in _MLFLOW_STORE_CACHES:
        cached: object = sys.modules.get(module)
        for name in path.split("."):
            cached = getattr(cached, name, None)
        info = getattr(cached, "cache_info", None)
        if info is not None and info().currsize:
            return True
    return False


def note_store_opened() -> None:
    """This process has an MLflow client on a store open (see ``database_opened``)."""
    global _opened
    _opened = True
