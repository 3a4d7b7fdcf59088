"""The Optuna storage the sweeper and every trial's job open: one sqlite file, many writers.

Imports Optuna only (no torch), for the sweeper's process as well as the jobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna.storages import RDBStorage

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.sqlite_health import sqlite_damage

__all__ = ["SQLITE_BUSY_TIMEOUT_S", "check_sqlite_storage", "rdb_storage"]

# How long a writer waits for sqlite's lock while other processes write to the same file.
SQLITE_BUSY_TIMEOUT_S = 30


def rdb_storage(url: str, *, create_tables: bool = True) -> RDBStorage:
    """An RDB storage that waits for sqlite's lock; ``create_tables=False`` where the study is
    known to exist (a trial's job), so that no job runs Optuna's table set-up."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    return RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=not create_tables)


def check_sqlite_storage(url: str, key: str) -> None:
    """Refuse a damaged sqlite file before Optuna opens it (which writes: tables, a study).

    Raises:
        FurcateConfigError: naming ``key``, the URL, what is wrong with the file and the fix.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # not a URL: Optuna says so
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return
    damage = sqlite_damage(Path(database))
    if damage is not None:
        raise FurcateConfigError(
            key, url, f"{damage.problem}; nothing was written to it", damage.fix(Path(database))
        )
