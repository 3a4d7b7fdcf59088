"""Which MLflow store jobs record into, a check that it answers (a sqlite file: that it is
sound) before anything runs, and its creation by one process at a time."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.addresses import StoreAddress
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.sqlite_health import sqlite_damage
from furcate_hydra.sqlite_lock import creating_sqlite_schema
from furcate_hydra.store.store_template import seed_new_store

__all__ = [
    "DEFAULT_TRACKING_URI",
    "TrackingUri",
    "check_tracking_uri",
    "creating_store",
    "resolve_tracking_uri",
]

# MLflow 3's own default: a sqlite file in the working directory, which `mlflow ui` opens.
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
URI_KEY = "hydra.launcher.mlflow.tracking_uri"
ENV_KEY = "MLFLOW_TRACKING_URI"
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


@dataclass(frozen=True)
class TrackingUri:
    """An absolute tracking URI and the setting it came from (named in errors)."""

    uri: str
    source: str

    @property
    def address(self) -> StoreAddress:
        return StoreAddress.parse(self.uri)

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a sqlite store (absolute, see ``resolve_tracking_uri``); None for any
        other store."""
        return self.address.sqlite_path


def resolve_tracking_uri(
    configured: str | None, environ: Mapping[str, str] | None = None, cwd: Path | None = None
) -> TrackingUri:
    """The configured URI, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.

    A relative sqlite path is made absolute against ``cwd`` (the launcher's working
    directory), because jobs may change directory (``hydra.job.chdir``) and must still write
    into the same file.
    """
    environ = os.environ if environ is None else environ
    if configured:
        uri, source = configured, URI_KEY
    elif environ.get(ENV_KEY):
        uri, source = environ[ENV_KEY], ENV_KEY
    else:
        uri, source = DEFAULT_TRACKING_URI, URI_KEY
    address = StoreAddress.parse(uri)
    if address.sqlite_path is not None:
        uri = address.absolute(cwd or Path.cwd()).url
    return TrackingUri(uri, source)


def check_tracking_uri(tracking: TrackingUri, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the URI and the fix, when the store cannot be used.

    MLflow's HTTP client retries an unreachable server for minutes; a sweep should say so
    in seconds and before any job starts. A damaged sqlite file is refused before anything
    writes into it.
    """
    uri, key = tracking.uri, tracking.source
    address = StoreAddress.parse(uri).checked(key)
    # MLflow's own spelling of a Databricks workspace is the bare word, which has no scheme.
    base = address.scheme or ("databricks" if uri == "databricks" else "")
    if base == "sqlite":
        _check_sqlite(address, key)
    elif base in ("http", "https"):
        _check_server(uri, key, timeout_s)
    elif base not in _SQL_SCHEMES and base != "databricks":
        raise FurcateConfigError(
            key,
            uri,
            "furcate records jobs in a database-backed MLflow store (sqlite, postgresql, "
            "mysql, mssql) or an MLflow server (http, https)",
            f"unset it to use {DEFAULT_TRACKING_URI} in the working directory, or give "
            "http://HOST:PORT of an `mlflow server`",
        )


@contextmanager
def creating_store(tracking: TrackingUri) -> Iterator[None]:
    """Hold while opening the first MLflow client on the store: a sqlite file's schema is
    created (and migrated) by one process at a time, and a new one is a copy of MLflow's
    empty store for this MLflow version (``store_template``: milliseconds, not the seconds
    MLflow's migrations take). A server creates its own schema; other databases are left to
    their administrators."""
    path = tracking.sqlite_path
    if path is None:
        yield
        return
    with creating_sqlite_schema(path):
        seed_new_store(path)
        yield


def _check_sqlite(address: StoreAddress, key: str) -> None:
    uri, path = address.url, address.sqlite_path
    if path is None:
        raise FurcateConfigError(
            key,
            uri,
            "an in-memory sqlite store vanishes with each process, so jobs cannot share it",
            f"use a file, e.g. {DEFAULT_TRACKING_URI}",
        )
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise FurcateConfigError(
            key,
            uri,
            f"the folder {folder} does not exist or is not writable",
            "create the folder, or point the URI at a writable path",
        )
    # Before MLflow opens it: MLflow writes (schema migrations, WAL) as it opens a store.
    damage = sqlite_damage(path)
    if damage is not None:
        raise FurcateConfigError(
            key, uri, f"{damage.problem}; nothing was written to it", damage.fix(path)
        )


def _check_server(uri: str, key: str, timeout_s: float) -> None:
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout_s) as response:
            if response.status == 200:
                return
            problem = f"{health} answered HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        problem = f"{health} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        problem = f"no MLflow server answers there ({reason})"
    raise FurcateConfigError(
        key,
        uri,
        problem,
        "start the server (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or fix the "
        f"address; unset it and MLFLOW_TRACKING_URI to record into {DEFAULT_TRACKING_URI}",
    )
