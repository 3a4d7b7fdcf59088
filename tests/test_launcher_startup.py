"""What a sweep starts, and when: nothing for a rerun whose every config finished; the fork
server as a fork of the launcher; jobs forked ahead of their slot, run one at a time on it."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import psutil
from hydra.core.utils import JobStatus

from furcate_hydra.execution.forkserver.names import SERVER_NAME
from furcate_hydra.execution.local_pool import LocalPool
from tests.conftest import LaunchJobs, run_probe_sweep
from tests.process_helpers import killed_if_left, start_probe_sweep, wait_for_descendants
from tests.store_helpers import connections_watched, job_runs, sweep_runs


def probed_sweep(tmp_path: Path, sweep: str, *overrides: str) -> tuple[dict[str, Any], str]:
    """The probe app's sweep through the CLI, with the start probe: what the launcher's
    process had imported and ran when the multirun ended, and the command's output."""
    probe = tmp_path / f"{sweep}.json"
    result = run_probe_sweep(
        tmp_path,
        f"hydra.sweep.dir={tmp_path / sweep}",
        "+hydra.callbacks.start_probe._target_=start_probe.StartProbe",
        f"+hydra.callbacks.start_probe.path={probe}",
        *overrides,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return json.loads(probe.read_text()), output


def test_a_rerun_whose_every_config_finished_starts_nothing(
    tmp_path: Path, mlflow_store: str
) -> None:
    first, output = probed_sweep(tmp_path, "first", "+i=0,1")
    # the fork server is a fork of the launcher, named so, and MLflow recorded the jobs
    assert first["children"] == [SERVER_NAME], output
    assert "mlflow" in first["modules"]

    again, output = probed_sweep(tmp_path, "again", "+i=0,1")
    assert "skipped 2 of 2 configs" in output
    # no fork server, no MLflow (the store was read with sqlite3), nothing written to the store
    assert again["children"] == []
    assert "mlflow" not in again["modules"] and "sqlalchemy" not in again["modules"]
    assert "starting the fork server" not in output and "opening the MLflow store" not in output
    assert len(job_runs(mlflow_store)) == 2 and len(sweep_runs(mlflow_store)) == 1
    # its own record: the store and experiment its values came from, no sweep run
    record = json.loads((tmp_path / "again" / "furcate_sweep.json").read_text())
    assert record["tracking_uri"] == mlflow_store and record["sweep_run_id"] is None
    assert record["experiment_id"] is not None
    rows = (tmp_path / "again" / "run_data.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",FINISHED,True," in row for row in rows[1:])


def test_a_rerun_that_finds_one_config_new_runs_it_and_records_the_sweep(
    tmp_path: Path, mlflow_store: str
) -> None:
    probed_sweep(tmp_path, "first", "+i=0")
    again, output = probed_sweep(tmp_path, "again", "+i=0,1")
    assert "skipped 1 of 2 configs" in output
    assert again["children"] == [SERVER_NAME]
    assert len(job_runs(mlflow_store)) == 2 and len(sweep_runs(mlflow_store)) == 2
    record = json.loads((tmp_path / "again" / "furcate_sweep.json").read_text())
    assert record["sweep_run_id"] in {run.info.run_id for run in sweep_runs(mlflow_store)}
    # the two sweeps' runs are told apart by their names' start (a narrow column shows that)
    names = sorted(run.info.run_name for run in sweep_runs(mlflow_store))
    assert len({name[:20] for name in names}) == 2, names


def test_jobs_wait_ahead_of_a_busy_slot_and_run_on_it_one_at_a_time(
    tmp_path: Path, mlflow_store: str
) -> None:
    # one slot, three jobs: while the first runs, the second is forked and waits at its gate
    process = start_probe_sweep(tmp_path, "+i=0,1,2", "sleep=4", "hydra.launcher.gpus=[3]")
    with killed_if_left(process):
        launcher = psutil.Process(process.pid)
        wait_for_descendants(launcher, 3, timeout=60)  # the server, the first job, the next
        first_done = (tmp_path / "sweep" / "0" / "probe.json").exists()
        process.communicate(timeout=120)
    assert process.returncode == 0
    assert not first_done  # the next job's process existed while the first one ran
    jobs = sorted(
        (json.loads((tmp_path / "sweep" / str(i) / "probe.json").read_text()) for i in range(3)),
        key=lambda job: job["started_at"],
    )
    # each on the slot's GPU, in a session of its own, never two at once on the slot
    assert {(job["slot"], job["cuda_visible_devices"]) for job in jobs} == {("0", "3")}
    assert all(job["pid"] == job["sid"] for job in jobs)
    for before, after in itertools.pairwise(jobs):
        assert after["started_at"] >= before["ended_at"]
    assert sorted(run.info.status for run in job_runs(mlflow_store)) == ["FINISHED"] * 3


def test_the_fork_server_is_a_new_interpreter_while_another_thread_runs(
    launch_jobs: LaunchJobs,
) -> None:
    # a fork copies only the forking thread: a lock another one holds would stay held
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        returns = launch_jobs([["+i=0"], ["+i=1"]], ["hydra.launcher.gpus=[0,1]"])
    finally:
        stop.set()
    pool = launch_jobs.last.session().executor
    assert isinstance(pool, LocalPool) and not pool.server_forked
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 2


def test_a_fork_server_forked_where_mlflow_has_a_store_open_leaves_its_connections_alone(
    launch_jobs: LaunchJobs, mlflow_store: str, tmp_path: Path
) -> None:
    # a sweeper that read a value back from the store before the first job: the fork server
    # is still a fork, which sets this process's connections aside; it and its jobs open their own
    import sqlite3

    from mlflow.tracking import MlflowClient

    trace = tmp_path / "statements-in-forks.txt"
    with connections_watched(trace):
        client = MlflowClient(mlflow_store)
        client.search_experiments()
        returns = launch_jobs([["+i=0"], ["+i=1"]], ["hydra.launcher.gpus=[0,1]"])
    assert not trace.exists(), trace.read_text()
    pool = launch_jobs.last.session().executor
    assert isinstance(pool, LocalPool) and pool.server_forked
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 2
    # this process's client still works on its own connections, and the file is whole
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    assert sum(1 for run in runs if run.info.status == "FINISHED") >= 2
    path = mlflow_store.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
