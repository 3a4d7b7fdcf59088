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
from urllib.parse import urlparse

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.sqlite_health import sqlite_damage
from furcate_hydra.sqlite_lock import creating_sqlite_schema

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
    def sqlite_path(self) -> Path | None:
        """The file of a sqlite store (``sqlite:///<path>``); None for any other store."""
        return Path(self.uri[len("sqlite:///") :]) if self.uri.startswith("sqlite:///") else None


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
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        if path and not path.startswith("/") and path != ":memory:":
            uri = "sqlite:///" + str((cwd or Path.cwd()) / path)
    return TrackingUri(uri, source)


def check_tracking_uri(tracking: TrackingUri, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the URI and the fix, when the store cannot be used.

    MLflow's HTTP client retries an unreachable server for minutes; a sweep should say so
    in seconds and before any job starts. A damaged sqlite file is refused before anything
    writes into it.
    """
    uri, key = tracking.uri, tracking.source
    # MLflow's own spelling of a Databricks workspace is the bare word, which has no scheme.
    scheme = urlparse(uri).scheme or ("databricks" if uri == "databricks" else "")
    base = scheme.split("+")[0]
    if base == "sqlite":
        _check_sqlite(uri, key)
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
    created (and migrated) by one process at a time. A server creates its own schema; other
    databases are left to their administrators."""
    if not tracking.uri.startswith("sqlite:///"):
        yield
        return
    with creating_sqlite_schema(Path(tracking.uri[len("sqlite:///") :])):
        yield


def _check_sqlite(uri: str, key: str) -> None:
    path = uri[len("sqlite:///") :]
    if not path or path == ":memory:":
        raise FurcateConfigError(
            key,
            uri,
            "an in-memory sqlite store vanishes with each process, so jobs cannot share it",
            f"use a file, e.g. {DEFAULT_TRACKING_URI}",
        )
    folder = Path(path).parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise FurcateConfigError(
            key,
            uri,
            f"the folder {folder} does not exist or is not writable",
            "create the folder, or point the URI at a writable path",
        )
    # Before MLflow opens it: MLflow writes (schema migrations, WAL) as it opens a store.
    damage = sqlite_damage(Path(path))
    if damage is not None:
        raise FurcateConfigError(
            key, uri, f"{damage.problem}; nothing was written to it", damage.fix(Path(path))
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
