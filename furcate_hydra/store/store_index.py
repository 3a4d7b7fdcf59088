"""Indexes of furcate's own on an MLflow store's ``tags`` table: ``furcate store index``.

MLflow indexes ``tags`` by (key, run_uuid) and by run_uuid, never by value. Three lookups ask
for runs by a tag's value, so on a big store each reads every tag of that key:

    skip check, claims     tags furcate.fingerprint IN (...)      (store/lookup.py, sqlite_reader)
    furcate status, mlflow ui's runs of one sweep
                           tags mlflow.parentRunId = <sweep run>   (MLflow's search_runs)

With a store of 1M runs that is 1M tag rows per lookup (see docs/benchmarks.md). The indexes
here answer them from the matching rows. They are extra: MLflow neither needs nor sees them,
its migrations rebuild the table around them, and ``drop_indexes`` removes every trace.

    sqlite       one index on tags (key, value)
    PostgreSQL   one partial index on tags (value) per key: a B-tree entry holds ~2.7 KB at
                 most, and other tags' values may hold up to 8,000 characters; made
                 CONCURRENTLY, so writers of a live store are not blocked
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from furcate_hydra.store.run_record import Tags

__all__ = [
    "INDEXED_TAGS",
    "StoreIndex",
    "create_indexes",
    "drop_indexes",
    "index_sqlite_store",
    "store_indexes",
    "tags_indexed",
]

log = logging.getLogger(__name__)

# the tags whose values furcate's lookups and MLflow's search of one sweep match
INDEXED_TAGS = (Tags.FINGERPRINT, Tags.PARENT_RUN)
_PREFIX = "furcate_tags_"
# A store with more tag rows than this takes a noticeable while to index: said before.
_SAY_FROM_ROWS = 200_000


@dataclass(frozen=True)
class StoreIndex:
    """One index furcate makes: its name and the statement that makes it."""

    name: str
    create: str


def store_indexes(dialect: str) -> list[StoreIndex]:
    """The indexes for a store of ``dialect`` (SQLAlchemy's name: sqlite, postgresql).

    Raises:
        ValueError: Naming the dialect, for a database other than sqlite or PostgreSQL.
    """
    if dialect == "sqlite":
        name = f"{_PREFIX}key_value"
        return [StoreIndex(name, f"CREATE INDEX IF NOT EXISTS {name} ON tags (key, value)")]
    if dialect == "postgresql":
        return [
            StoreIndex(
                name := f"{_PREFIX}{key.replace('.', '_').lower()}",
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON tags (value) "
                f"WHERE key = '{key}'",
            )
            for key in INDEXED_TAGS
        ]
    raise ValueError(
        f"furcate store indexes are made for sqlite and PostgreSQL stores, but got {dialect=}: "
        "index tags (key, value) there by hand, with a prefix of value where the database "
        "limits an index entry's length"
    )


def create_indexes(engine: Any) -> list[str]:
    """Make the indexes on ``engine``'s store that it lacks; returns those made."""
    _INDEXED.pop(str(engine.url), None)
    present = _present(engine)
    made = []
    # CONCURRENTLY runs outside a transaction
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for index in store_indexes(engine.dialect.name):
            if index.name not in present:
                connection.exec_driver_sql(index.create)
                made.append(index.name)
    return made


def drop_indexes(engine: Any) -> list[str]:
    """Drop every index furcate made on ``engine``'s store; returns those dropped."""
    _INDEXED.pop(str(engine.url), None)
    dropped = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for name in sorted(_present(engine)):
            connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
            dropped.append(name)
    return dropped


def index_sqlite_store(path: Path) -> bool:
    """Give the sqlite store at ``path`` furcate's index where it lacks it (``hydra.launcher.
    mlflow.sqlite_index``): without it the skip and claim checks read every fingerprint tag of
    the store, a cost per job that grows with every run it records. Returns whether it was made.

    A store MLflow has not created yet (no ``tags`` table) is left alone: the launcher asks
    again once MLflow made it. Made inside one transaction, so a launcher killed meanwhile
    leaves the store as it was.
    """
    if not path.is_file():  # sqlite3 would create it: MLflow makes the store, then this
        return False
    try:
        return _index_sqlite(path)
    except sqlite3.Error as exc:  # a store MLflow will refuse, or locked for a minute
        log.warning(
            "furcate: could not index the tags of %s (%s): its skip and claim checks read "
            "every fingerprint tag; `furcate index` makes the index later",
            path,
            exc,
        )
        return False


def _index_sqlite(path: Path) -> bool:
    (index,) = store_indexes("sqlite")
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as connection:
        names = {
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE name IN ('tags', ?)", (index.name,)
            )
        }
        if "tags" not in names or index.name in names:
            return False
        # the rowid's top is a cheap upper bound of the rows (MLflow's tags keep rowids)
        (rows,) = connection.execute("SELECT coalesce(max(rowid), 0) FROM tags").fetchone()
        if rows > _SAY_FROM_ROWS:
            log.info(
                "furcate: indexing the tags of %s by value once (~%d rows; seconds to minutes): "
                "the skip and claim checks then read only the configs' own runs "
                "(hydra.launcher.mlflow.sqlite_index=false leaves a store as it is)",
                path,
                rows,
            )
        began = time.monotonic()
        with connection:
            connection.execute(index.create)
    _INDEXED.clear()
    if rows:
        log.info(
            "furcate: made %s on %s in %.1f s (`furcate index --drop` removes it; "
            "hydra.launcher.mlflow.sqlite_index=false then keeps it away)",
            index.name,
            path,
            time.monotonic() - began,
        )
    return True


def tags_indexed(engine: Any) -> bool:
    """Whether ``engine``'s store has furcate's indexes, as the process first saw it (asked
    once per store: an index made while a launcher runs serves its next start)."""
    url = str(engine.url)
    if url not in _INDEXED:
        try:
            wanted = {index.name for index in store_indexes(engine.dialect.name)}
        except ValueError:
            wanted = set()
        _INDEXED[url] = bool(wanted) and wanted <= _present(engine)
    return _INDEXED[url]


_INDEXED: dict[str, bool] = {}


def _present(engine: Any) -> set[str]:
    """furcate's indexes on ``tags`` now (by name, whatever their definition)."""
    import sqlalchemy as sa

    names = {index["name"] or "" for index in sa.inspect(engine).get_indexes("tags")}
    return {name for name in names if name.startswith(_PREFIX)}
