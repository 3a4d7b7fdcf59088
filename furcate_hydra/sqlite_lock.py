"""One process at a time creates a sqlite file's schema: an exclusive ``flock`` beside it.

MLflow and Optuna both create their tables as their first client opens a new file, with no
lock of their own; two processes opening a fresh file at once both create them, and one
fails ("table studies already exists", or alembic's "Online migration expected to match one
row"). Holding ``<db>.lock`` while opening makes the second wait and then find the schema made.
A reader that goes around the client (plain sqlite3) holds it shared, so it never reads a
schema half made.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["creating_sqlite_schema", "sqlite_schema_made"]


@contextmanager
def creating_sqlite_schema(database: Path) -> Iterator[None]:
    """Hold while opening the first client on the sqlite file ``database``."""
    lock = database.with_name(database.name + ".lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


@contextmanager
def sqlite_schema_made(database: Path) -> Iterator[None]:
    """Hold while reading the sqlite file ``database`` without a client that creates its
    schema: waits for a process creating it to finish; readers do not wait for each other."""
    lock = database.with_name(database.name + ".lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)  # released when the file is closed
        yield
