"""Every job an MLflow run; a rerun skips what finished and runs only what is new or failed.

Real CLI runs of the probe app (real fork server and job processes) against a real sqlite
store in tmp_path. Where a sweep only records what a later CLI sweep must find, the launcher
runs it in this process (``recorded_sweep``): the same launcher, fork server, jobs and store.
"""

from __future__ import annotations

import csv
import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobStatus

from furcate_hydra.records.before_run import sweep_run_name
from furcate_hydra.store import Tags
from furcate_hydra.store.store_template import CACHE_VAR, template_path
from tests.conftest import LaunchJobs, run_probe_sweep
from tests.process_helpers import killed_if_left, start_probe_sweep
from tests.store_helpers import artifact_names, job_runs, sweep_runs


def ran(sweep: Path) -> list[str]:
    """Job dirs under a sweep dir in which the task actually ran."""
    return sorted(p.parent.name for p in sweep.glob("*/probe.json"))


def sweep(tmp_path: Path, name: str, *overrides: str) -> Any:
    result = run_probe_sweep(tmp_path, f"hydra.sweep.dir={tmp_path / name}", *overrides)
    assert result.returncode == 0, result.stderr
    return result


def recorded_sweep(launch_jobs: LaunchJobs, sweep_dir: Path, *jobs: list[str]) -> None:
    """A sweep of ``jobs`` (each one's overrides) run by the launcher in this process: the
    store as a first CLI sweep leaves it, for a test whose CLI sweep reruns it."""
    returns = launch_jobs(list(jobs), [f"hydra.sweep.dir={sweep_dir}"])
    launch_jobs.last.close()  # the sweep's run ends, as when the CLI's process exits
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * len(jobs)


def test_every_job_is_a_run_under_the_sweep_run(tmp_path: Path, mlflow_store: str) -> None:
    sweep(tmp_path, "a", "+lr=0.1,0.01", "+model.width=8")
    runs = job_runs(mlflow_store)
    (parent,) = sweep_runs(mlflow_store)
    assert len(runs) == 2
    assert parent.info.status == "FINISHED"
    for run in runs:
        tags, params = run.data.tags, run.data.params
        assert run.info.status == "FINISHED"
        assert tags[Tags.PARENT_RUN] == parent.info.run_id
        assert len(tags[Tags.FINGERPRINT]) == 64
        assert tags[Tags.HOST] == socket.gethostname()
        assert int(tags[Tags.LAUNCHER_PID]) > 0
        assert tags[Tags.JOB_NUM] in {"0", "1"}
        job_dir = Path(tags[Tags.OUTPUT_DIR])
        assert job_dir.parent == tmp_path / "a"
        assert tags[Tags.OVERRIDES].startswith("+lr=")
        # The flattened task config, dotted keys, as params.
        assert params["mode"] == "ok" and params["model.width"] == "8"
        assert params["lr"] in {"0.1", "0.01"}
        # The recorded return value is what the task returned (probe.json holds the same).
        value = json.loads(tags[Tags.RETURN_VALUE].removeprefix("json:"))
        assert value == json.loads((job_dir / "probe.json").read_text())
        assert {"stdout.log", "stderr.log", "run_data.json"} <= artifact_names(
            mlflow_store, run.info.run_id
        )
        run_data = json.loads((job_dir / "run_data.json").read_text())
        assert run_data["status"] == "FINISHED" and run_data["run_id"] == run.info.run_id
        assert run_data["config"]["lr"] in {0.1, 0.01}
        assert run_data["duration_s"] >= 0 and run_data["slot"]["index"] in {0, 1}
    assert len({r.data.tags[Tags.FINGERPRINT] for r in runs}) == 2
    rows = list(csv.DictReader((tmp_path / "a" / "run_data.csv").open()))
    assert [row["job_num"] for row in rows] == ["0", "1"]
    assert {row["status"] for row in rows} == {"FINISHED"}
    assert "run_data.csv" in artifact_names(mlflow_store, parent.info.run_id)


def test_the_same_sweep_twice_runs_nothing_the_second_time(
    tmp_path: Path, mlflow_store: str, launch_jobs: LaunchJobs
) -> None:
    # the first sweep of +lr=0.1,0.01,0.001 in this process, the second through the CLI
    recorded_sweep(launch_jobs, tmp_path / "first", ["+lr=0.1"], ["+lr=0.01"], ["+lr=0.001"])
    second = sweep(tmp_path, "second", "+lr=0.1,0.01,0.001")
    assert ran(tmp_path / "first") == ["0", "1", "2"]
    assert ran(tmp_path / "second") == []
    assert "skipped 3 of 3 configs" in second.stdout + second.stderr
    assert len(job_runs(mlflow_store)) == 3
    # a sweep that ran nothing wrote nothing into the store: its sweep dir is its record
    assert len(sweep_runs(mlflow_store)) == 1
    rows = list(csv.DictReader((tmp_path / "second" / "run_data.csv").open()))
    assert [row["skipped"] for row in rows] == ["True"] * 3


def test_a_sweep_run_is_named_by_its_start_and_its_overrides() -> None:
    morning = time.mktime((2026, 11, 23, 9, 5, 7, 0, 0, -1))
    assert sweep_run_name(morning, "+lr=0.1,0.01") == "09:05:07 +lr=0.1,0.01"
    assert sweep_run_name(morning + 1, "+lr=0.1,0.01") == "09:05:08 +lr=0.1,0.01"
    assert sweep_run_name(morning, "") == "09:05:07 sweep"  # the grid is in the config
    assert len(sweep_run_name(morning, "x=" + "1," * 500)) == 240  # MLflow keeps 250


def test_skipped_jobs_return_the_recorded_values(launch_jobs: LaunchJobs) -> None:
    jobs = [["+lr=0.1"], ["+lr=0.01"]]
    first = launch_jobs(jobs, [])
    second = launch_jobs(jobs, [])
    assert [r.status for r in second] == [JobStatus.COMPLETED] * 2
    # The probe returns its pid and timings: equal values mean nothing ran again.
    assert [r.return_value for r in second] == [r.return_value for r in first]
    assert [r.overrides for r in second] == [["+lr=0.1"], ["+lr=0.01"]]


def test_a_config_twice_in_one_launch_runs_once(
    tmp_path: Path, mlflow_store: str, launch_jobs: LaunchJobs
) -> None:
    returns = launch_jobs([["+lr=0.1"], ["+lr=0.1"], ["+lr=0.2"]], [])
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 3
    # the twin waited for the first one's run and returns its value (the probe's pid, times)
    assert returns[1].return_value == returns[0].return_value
    assert ran(tmp_path / "sweep") == ["0", "2"]
    assert len(job_runs(mlflow_store)) == 2
    twin = json.loads((tmp_path / "sweep" / "1" / "run_data.json").read_text())
    assert twin["skipped"] is True and twin["ran_elsewhere"] is True


def test_a_value_added_to_the_sweep_runs_only_the_new_configs(
    tmp_path: Path, mlflow_store: str, launch_jobs: LaunchJobs
) -> None:
    # the first sweep of +lr=0.1,0.01 +bs=32 in this process, the second through the CLI
    recorded_sweep(launch_jobs, tmp_path / "first", ["+lr=0.1", "+bs=32"], ["+lr=0.01", "+bs=32"])
    second = sweep(tmp_path, "second", "+lr=0.1,0.01", "+bs=32,64")
    # Hydra orders the grid lr-major: (0.1,32) (0.1,64) (0.01,32) (0.01,64).
    assert ran(tmp_path / "second") == ["1", "3"]
    assert "skipped 2 of 4 configs" in second.stdout + second.stderr
    fingerprints = [r.data.tags[Tags.FINGERPRINT] for r in job_runs(mlflow_store)]
    assert len(fingerprints) == len(set(fingerprints)) == 4


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (four sweeps)
def test_fingerprint_ignore_keys_do_not_make_a_config_new(
    tmp_path: Path, launch_jobs: LaunchJobs
) -> None:
    # the first sweep in this process, the two that read its record through the CLI
    recorded_sweep(launch_jobs, tmp_path / "first", ["+lr=0.1", "+num_workers=2"])
    sweep(
        tmp_path,
        "second",
        "+lr=0.1",
        "+num_workers=4",
        "hydra.launcher.fingerprint_ignore=[num_workers]",
    )
    # Without the ignore list the first run's fingerprint included num_workers=2, so the
    # second run (num_workers=4) is new either way; a third with the list set matches it.
    sweep(
        tmp_path,
        "third",
        "+lr=0.1",
        "+num_workers=8",
        "hydra.launcher.fingerprint_ignore=[num_workers]",
    )
    assert ran(tmp_path / "second") == ["0"]
    assert ran(tmp_path / "third") == []


@pytest.mark.slow  # several CLI sweeps in a row
def test_failed_configs_run_again_by_default(tmp_path: Path, mlflow_store: str) -> None:
    result = run_probe_sweep(tmp_path, f"hydra.sweep.dir={tmp_path / 'first'}", "mode=ok,raise")
    assert result.returncode != 0
    statuses = sorted(r.info.status for r in job_runs(mlflow_store))
    assert statuses == ["FAILED", "FINISHED"]
    failed = next(r for r in job_runs(mlflow_store) if r.info.status == "FAILED")
    assert "ValueError: the task raised on purpose" in failed.data.tags[Tags.ERROR]

    # rerun=none: the failure is reported from the record, nothing runs.
    result = run_probe_sweep(
        tmp_path,
        f"hydra.sweep.dir={tmp_path / 'none'}",
        "mode=ok,raise",
        "hydra.launcher.rerun=none",
    )
    assert result.returncode != 0 and "rerun=none" in result.stderr
    assert ran(tmp_path / "none") == []

    # Default (failed): only the failed config runs again.
    run_probe_sweep(tmp_path, f"hydra.sweep.dir={tmp_path / 'again'}", "mode=ok,raise")
    assert (tmp_path / "again" / "1" / "stdout.log").exists()
    assert not (tmp_path / "again" / "0" / "stdout.log").exists()  # FINISHED: not run again

    # all: everything runs, each in a new run.
    sweep(tmp_path, "all", "mode=ok", "hydra.launcher.rerun=all")
    assert ran(tmp_path / "all") == ["0"]
    assert sorted(r.info.status for r in job_runs(mlflow_store)) == [
        "FAILED",
        "FAILED",
        "FINISHED",
        "FINISHED",
    ]


@pytest.mark.slow  # several CLI sweeps in a row
def test_default_store_is_mlflow_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    sweep(tmp_path, "a", "+lr=0.1")
    runs = job_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.data.params["lr"] for r in runs] == ["0.1"]
    assert runs[0].info.experiment_id != "0"  # experiment named after the task


def test_experiment_name_and_disabled_store(tmp_path: Path, mlflow_store: str) -> None:
    sweep(tmp_path, "named", "+lr=0.1", "hydra.launcher.mlflow.experiment_name=my-study")
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(mlflow_store).get_experiment_by_name("my-study")
    assert experiment is not None
    sweep(tmp_path, "off", "+lr=0.1", "hydra.launcher.mlflow.enabled=false")
    assert ran(tmp_path / "off") == ["0"]  # no store: nothing to skip from
    assert len(job_runs(mlflow_store)) == 1
    assert json.loads((tmp_path / "off" / "0" / "run_data.json").read_text())["run_id"] is None


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (two sweeps)
def test_sqlite_store_is_switched_to_wal_unless_disabled(
    tmp_path: Path, empty_mlflow_db: Path
) -> None:
    import sqlite3

    def journal_mode(db: Path) -> str:
        with sqlite3.connect(db) as connection:
            return str(connection.execute("PRAGMA journal_mode").fetchone()[0])

    plain = tmp_path / "plain.db"
    # an initialised store in the default journal mode, so the CLI run skips the migrations
    shutil.copyfile(empty_mlflow_db, plain)
    assert journal_mode(plain) == "delete"
    sweep(tmp_path, "off", "+lr=0.1", f"hydra.launcher.mlflow.tracking_uri=sqlite:///{plain}",
          "hydra.launcher.mlflow.sqlite_wal=false")  # fmt: skip
    assert journal_mode(plain) == "delete"
    sweep(tmp_path, "on", "+lr=0.2", f"hydra.launcher.mlflow.tracking_uri=sqlite:///{plain}")
    assert journal_mode(plain) == "wal"
    assert len(job_runs(f"sqlite:///{plain}")) == 2  # nothing lost by the switch


def test_a_killed_launchers_sweep_run_is_ended_by_the_next_launcher(
    tmp_path: Path, mlflow_store: str
) -> None:
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    with killed_if_left(start_probe_sweep(first_dir, "+i=0,1", "sleep=60")) as first:
        deadline = time.monotonic() + 60
        while not any(r.info.status == "RUNNING" for r in job_runs(mlflow_store)):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no job started"
            time.sleep(0.1)
        first.kill()  # the launcher alone, as the OOM killer would
        first.wait()
    (killed,) = sweep_runs(mlflow_store)
    assert killed.info.status == "RUNNING"  # nobody was left to end it

    rerun = run_probe_sweep(tmp_path, "+i=2")
    assert rerun.returncode == 0, rerun.stderr
    assert f"sweep run {killed.info.run_id}" in rerun.stdout + rerun.stderr
    assert "has exited: marked KILLED" in rerun.stdout + rerun.stderr
    ended, new = sweep_runs(mlflow_store)
    assert ended.info.run_id == killed.info.run_id
    assert ended.info.status == "KILLED" and ended.info.end_time is not None
    assert "has exited" in ended.data.tags[Tags.ERROR]
    assert new.info.status == "FINISHED"


def test_the_first_sweep_in_a_new_directory_copies_mlflows_empty_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cache of its own: the first sweep makes the template, the next new store is a copy
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    made = sweep(tmp_path, "a", "+lr=0.1", f"hydra.launcher.mlflow.tracking_uri=sqlite:///{first}")
    copied = sweep(
        tmp_path, "b", "+lr=0.1", f"hydra.launcher.mlflow.tracking_uri=sqlite:///{second}"
    )
    assert template_path().is_file()
    creating = "Creating initial MLflow database tables"
    assert (made.stdout + made.stderr).count(creating) == 1  # the template's, once
    assert creating not in copied.stdout + copied.stderr  # a copy: nothing to create
    for store in (first, second):  # each a store MLflow uses as its own
        (run,) = job_runs(f"sqlite:///{store}")
        assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
