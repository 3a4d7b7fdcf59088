"""One process at a time creates a sqlite file's schema: an exclusive ``flock`` beside it.

MLflow and Optuna both create their tables as their first client opens a new file, with no
lock of their own; two processes opening a fresh file at once both create them, and one
fails ("table studies already exists", or alembic's "Online migration expected to match one
row"). Holding ``<db>.lock`` while opening makes the second wait and then find the schema made.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["creating_sqlite_schema"]


@contextmanager
def creating_sqlite_schema(database: Path) -> Iterator[None]:
    """Hold while opening the first client on the sqlite file ``database``."""
    lock = database.with_name(database.name + ".lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield
