"""How a fork leaves its parent's database connections alone, and how the fork server has
the sweep's MLflow store built once for all its jobs.

A fork inherits the SQLAlchemy engines MLflow made in its parent (MLflow caches its stores,
and one engine per database URI), each with a pool of open connections. SQLite forbids using a
connection across a fork, closing it included (closing the last one checkpoints a WAL file the
parent is writing); a PostgreSQL connection shared by two processes garbles both. So a fork
that serves jobs (the fork server) gives every inherited MLflow engine a new, empty pool, as
SQLAlchemy advises for forks, and keeps the old pools referenced, never used. The stores stay
cached and usable: what runs in the fork connects on its own. (Other engines the parent holds,
a sweeper's Optuna storage, are never used by its jobs.)
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from furcate_hydra.store.tracking_uri import TrackingUri, creating_store

__all__ = [
    "build_store_for_forks",
    "close_mlflow_connections",
    "load_run_for_forks",
    "set_aside_inherited_connections",
]

# A fork's inherited pools (with the parent's connections): referenced, never used. The fork
# and its jobs end by ``os._exit``: nothing closes them then.
_SET_ASIDE: list[object] = []


def set_aside_inherited_connections() -> int:
    """In a fork: every MLflow database engine it inherited gets a new pool, and the old one,
    with the parent's connections, is set aside (see the module doc). Returns how many."""
    engines = _mlflow_engines()
    for engine in engines:
        _SET_ASIDE.append(engine.pool)
        engine.dispose(close=False)  # the new pool opens the fork's own connections
    return len(engines)


def build_store_for_forks(tracking_uri: str) -> None:
    """Build and cache MLflow's store for ``tracking_uri`` in this process (the fork server,
    its inherited connections set aside first), then close the connections that took, so that
    every job forked from here finds the store built (its engine made, its schema checked:
    ~0.1 s of a job's CPU) and connects on its own.

    Best effort: a store that cannot be opened now is left to the job, which reports why.
    """
    from mlflow.tracking import MlflowClient

    # the launcher may be creating a new sqlite store's schema right now: wait for it
    schema = creating_store(TrackingUri(tracking_uri, "the sweep's tracking URI"))
    with _own_connections_closed(), schema:
        MlflowClient(tracking_uri)  # builds the store, cached by MLflow for this URI


def load_run_for_forks(tracking_uri: str, run_id: str) -> None:
    """Load the run ``run_id`` once in this process (the fork server, before it forks that
    run's job), then close the connection that took: a process's first run loaded sets up
    SQLAlchemy's loading of MLflow's runs (~0.17 s here), which every job forked later inherits
    instead of paying. Best effort, as ``build_store_for_forks``."""
    from mlflow.tracking import MlflowClient

    with _own_connections_closed():
        MlflowClient(tracking_uri).get_run(run_id)


def close_mlflow_connections() -> None:
    """Close every connection this process opened to MLflow's databases (the stores stay
    cached and usable: they connect again when used). Closing a sqlite store's last
    connection folds its WAL file into the database file."""
    for engine in _mlflow_engines():
        engine.dispose()  # this process's own connections: closed, the pool left empty


@contextmanager
def _own_connections_closed() -> Iterator[None]:
    """Run the block, then close every connection this process opened, whether the block
    succeeded or not (a failed query still leaves its connection in the pool, which the jobs
    forked later would share); its error is left to the job, which meets it again."""
    try:
        yield
    except Exception:  # the job opens the store again and says what is wrong
        pass
    finally:
        close_mlflow_connections()


def _mlflow_engines() -> list[Any]:
    """The SQLAlchemy engines MLflow made in this process (and its parents)."""
    module = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    if module is None:  # no SQL store was ever loaded
        return []
    # MLflow keeps one engine per database URI, shared by its stores
    by_uri = getattr(getattr(module, "SqlAlchemyStore", None), "_engine_map", None)
    if isinstance(by_uri, dict):
        return list(by_uri.values())
    # an MLflow without that map: each store has its own; found among all objects (~0.15 s)
    engine_type = sys.modules["sqlalchemy.engine"].Engine
    return [obj for obj in gc.get_objects() if isinstance(obj, engine_type)]
