"""The Optuna storage the sweeper and every trial's job open: one sqlite file, many writers.

Imports Optuna only (no torch), for the sweeper's process as well as the jobs.
"""

from __future__ import annotations

import random
import time
from typing import Any

from optuna.storages import RDBStorage

from furcate_hydra.addresses import StoreAddress
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.quick_exit import close_at_exit
from furcate_hydra.sqlite_health import sqlite_damage
from furcate_hydra.sqlite_lock import creating_sqlite_schema

__all__ = ["SQLITE_BUSY_TIMEOUT_S", "check_sqlite_storage", "rdb_storage"]

# How long a writer waits for sqlite's lock while other processes write to the same file.
SQLITE_BUSY_TIMEOUT_S = 30
# tries to open a new database server's storage while other launchers create its tables
_CREATE_ATTEMPTS = 5


def rdb_storage(url: str, *, create_tables: bool = True) -> RDBStorage:
    """An RDB storage that waits for sqlite's lock; ``create_tables=False`` where the study is
    known to exist (a trial's job), so that no job runs Optuna's table set-up."""
    storage = _rdb_storage(url, create_tables)
    # where the process ends quickly (the launcher's), its connections are closed first
    close_at_exit(storage.engine.dispose)
    return storage


def _rdb_storage(url: str, create_tables: bool) -> RDBStorage:
    engine_kwargs: dict[str, Any] = {}
    address = StoreAddress.parse(url)
    if address.is_sqlite:
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    database = address.sqlite_path
    if not create_tables:
        return RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=True)
    if database is None:
        return _created_on_a_server(url, engine_kwargs)
    # Optuna creates its tables with no lock: two processes opening a new file at once both
    # create them and one fails ("table studies already exists")
    with creating_sqlite_schema(database):
        return RDBStorage(url, engine_kwargs=engine_kwargs)


def _created_on_a_server(url: str, engine_kwargs: dict[str, Any]) -> RDBStorage:
    """A database server's storage, its tables created by whichever launcher comes first.

    Launchers that start at once (a Slurm job array) race to create Optuna's tables in a new
    database: PostgreSQL refuses all but one ("duplicate key value violates unique constraint
    pg_type_typname_nsp_index", "relation ... already exists"). The others try again once the
    first one's tables are there, when Optuna's set-up finds them and creates nothing.
    """
    import sqlalchemy.exc

    for attempt in range(_CREATE_ATTEMPTS):
        try:
            return RDBStorage(url, engine_kwargs=engine_kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == _CREATE_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.2, 1.0))
    raise AssertionError("unreachable")


def check_sqlite_storage(url: str, key: str) -> None:
    """Refuse a damaged sqlite file before Optuna opens it (which writes: tables, a study).

    Raises:
        FurcateConfigError: naming ``key``, the URL, what is wrong with the file and the fix.
    """
    database = StoreAddress.parse(url).checked(key).sqlite_path  # no URL at all: Optuna says
    if database is None:
        return
    damage = sqlite_damage(database)
    if damage is not None:
        raise FurcateConfigError(
            key, url, f"{damage.problem}; nothing was written to it", damage.fix(database)
        )
