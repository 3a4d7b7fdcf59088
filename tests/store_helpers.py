"""Read back what a sweep recorded in its MLflow store."""

from __future__ import annotations

import subprocess
from dataclasses import replace
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
