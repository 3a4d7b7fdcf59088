"""The Optuna storage the sweeper and every trial's job open: one sqlite file, many writers.

Imports Optuna only (no torch), for the sweeper's process as well as the jobs.
"""

from __future__ import annotations

from typing import Any

from optuna.storages import RDBStorage

__all__ = ["SQLITE_BUSY_TIMEOUT_S", "rdb_storage"]

# How long a writer waits for sqlite's lock while other processes write to the same file.
SQLITE_BUSY_TIMEOUT_S = 30


def rdb_storage(url: str, *, create_tables: bool = True) -> RDBStorage:
    """An RDB storage that waits for sqlite's lock; ``create_tables=False`` where the study is
    known to exist (a trial's job), so that no job runs Optuna's table set-up."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    return RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=not create_tables)
