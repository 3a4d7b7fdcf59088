"""Whether this process has an MLflow store open, and how a fork of it leaves those alone.

A fork inherits the store MLflow cached, with its database connections, which SQLite forbids
to use across a fork, closing them included (closing the last one checkpoints a WAL file the
parent is writing). So a fork that serves jobs (the fork server) sets them aside: it keeps
every inherited store referenced, never used, and empties MLflow's caches, so that what runs
in it opens its own. The fork and its jobs end by ``os._exit``: nothing closes them then.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["database_opened", "note_store_opened", "set_aside_inherited_stores"]

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

    A fork of this process that serves jobs must then set them aside first
    (``set_aside_inherited_stores``): its jobs would find the cached store and use connections
    the launcher uses too.
    """
    if _opened:
        return True
    for cached in _caches():
        info = getattr(cached, "cache_info", None)
        if info is not None and info().currsize:
            return True
    return False


# A fork's inherited stores (with their engines and connections): referenced, never used.
_SET_ASIDE: list[object] = []


def set_aside_inherited_stores() -> int:
    """In a fork of a process that had MLflow stores open: keep them referenced and untouched,
    and empty MLflow's caches (see the module doc). Returns how many were set aside."""
    if not database_opened():
        return 0
    inherited = [obj for obj in gc.get_objects() if _is_database_store(obj)]
    _SET_ASIDE.extend(inherited)
    for cache in _caches():
        clear = getattr(cache, "cache_clear", None)
        if clear is not None:
            clear()
    global _opened
    _opened = False
    return len(inherited)


def _is_database_store(obj: object) -> bool:
    kind = type(obj)
    module = kind.__dict__.get("__module__")  # not every type keeps a string there
    return (
        isinstance(module, str)
        and module.startswith("mlflow.store.")
        and ("SqlAlchemyStore" in kind.__name__)
    )


def _caches() -> list[object]:
    found = []
    for module, path in _MLFLOW_STORE_CACHES:
        cached: object = sys.modules.get(module)
        for name in path.split("."):
            cached = getattr(cached, name, None)
        if cached is not None:
            found.append(cached)
    return found


def note_store_opened() -> None:
    """This process has an MLflow client on a store open (see ``database_opened``)."""
    global _opened
    _opened = True
