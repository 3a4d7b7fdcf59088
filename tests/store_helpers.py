"""Read back what a sweep recorded in its MLflow store."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from furcate_hydra.store import LauncherIdentity, Tags
from furcate_hydra.store.liveness import process_start_ticks


def job_runs(uri: str) -> list[Any]:
    """Every job run (not sweep runs) in the store, oldest first."""
    return [r for r in all_runs(uri) if r.data.tags.get(Tags.ROLE) != "sweep"]


def sweep_runs(uri: str) -> list[Any]:
    return [r for r in all_runs(uri) if r.data.tags.get(Tags.ROLE) == "sweep"]


def all_runs(uri: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, max_results=10000)
    return sorted(runs, key=lambda r: r.info.start_time)


def artifact_names(uri: str, run_id: str, path: str | None = None) -> set[str]:
    from mlflow.tracking import MlflowClient

    return {f.path for f in MlflowClient(uri).list_artifacts(run_id, path)}


def exited_launcher() -> LauncherIdentity:
    """This machine's identity, but with the pid and start time of a process that has exited."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = process_start_ticks(child.pid)
        assert started is not None
    finally:
        child.kill()
        child.wait()
    return replace(LauncherIdentity.current(), pid=child.pid, started=started)


@contextmanager
def connections_watched(trace: Path) -> Iterator[None]:
    """Each database connection an engine opens meanwhile writes into ``trace`` what a process
    other than its opener (a fork) does with it: takes it from the pool, closes it, or (SQLite)
    runs a statement on it."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def note(what: str) -> None:
        with trace.open("a") as out:
            out.write(f"{os.getpid()} {what}\n")

    def opened(dbapi_connection: Any, record: Any) -> None:
        opener = record.info["opener"] = os.getpid()

        def traced(statement: str) -> None:
            if os.getpid() != opener:
                note(statement)

        if hasattr(dbapi_connection, "set_trace_callback"):
            dbapi_connection.set_trace_callback(traced)

    def used(what: str) -> Callable[..., None]:
        def by_another(_dbapi_connection: Any, record: Any, *_: Any) -> None:
            if record.info.get("opener", os.getpid()) != os.getpid():
                note(what)

        return by_another

    watchers = [("connect", opened), ("checkout", used("checkout")), ("close", used("close"))]
    for name, watcher in watchers:
        event.listen(Engine, name, watcher)
    try:
        yield
    finally:
        for name, watcher in watchers:
            event.remove(Engine, name, watcher)
