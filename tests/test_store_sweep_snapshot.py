"""Reading a sweep back: the rules that turn runs and run_data.json rows into job states, and a
real store's sweep read through its sweep dir (real processes: test_cli_status.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.layout import SweepPaths
from furcate_hydra.progress import JobProgress
from furcate_hydra.store import RunRecord, RunStatus, RunStore, Tags, resolve_tracking_uri
from furcate_hydra.store.sweep_pointer import SweepPointer
from furcate_hydra.store.sweep_reader import INTERMEDIATE_METRIC, SweepReader
from furcate_hydra.store.sweep_snapshot import (
    FileRow,
    JobSnapshot,
    StoredRun,
    SweepJobStatus,
    job_snapshots,
)

NOW = 1_000_000.0


def run(run_id: str, status: RunStatus, num: int, tags: dict[str, str] | None = None) -> StoredRun:
    all_tags = {Tags.JOB_NUM: str(num), Tags.OVERRIDES: f"x={num}", Tags.OUTPUT_DIR: f"/s/{num}"}
    record = RunRecord(run_id, "fp", status, int((NOW - 100) * 1000), {**all_tags, **(tags or {})})
    ended = None if status is RunStatus.RUNNING else int((NOW - 50) * 1000)
    return StoredRun(record, ended, {"loss": 0.5})


def row(num: int, status: str, run_id: str | None, **fields: Any) -> FileRow:
    values: dict[str, Any] = {
        "job_num": num,
        "overrides": (f"x={num}",),
        "status": status,
        "skipped": False,
        "run_id": run_id,
        "output_dir": f"/s/{num}",
        "return_value": None,
        "error": None,
        "start": NOW - 30,
        "end": None,
        "resumed": False,
        "metrics": {},
    }
    return FileRow(**{**values, **fields})


def snapshots(
    runs: list[StoredRun],
    rows: Sequence[FileRow] = (),
    gone: str | None = None,
    pruned: dict[str, int | None] | None = None,
    recorded: dict[str, StoredRun] | None = None,
    alive: bool = True,
) -> dict[int, JobSnapshot]:
    jobs = job_snapshots(
        runs,
        list(rows),
        gone=lambda record: gone,
        progress=lambda output_dir: JobProgress(2, 20, {}, NOW),
        alive=lambda pid: alive,
        pruned_epochs=pruned or {},
        recorded=recorded or {},
        now=NOW,
    )
    return {job.job_num: job for job in jobs}


def test_a_running_run_is_queued_until_its_process_starts() -> None:
    runs = [run("a", RunStatus.RUNNING, 0), run("b", RunStatus.RUNNING, 1)]
    jobs = snapshots(runs, [row(0, "RUNNING", "a")])  # the launcher wrote it at the start
    assert jobs[0].status is SweepJobStatus.RUNNING
    assert jobs[0].start == NOW - 30 and jobs[0].duration_s == 30
    assert jobs[0].progress == JobProgress(2, 20, {}, NOW)
    assert jobs[1].status is SweepJobStatus.QUEUED
    assert jobs[1].start is None and jobs[1].duration_s is None and jobs[1].progress is None


def test_running_runs_of_a_gone_launcher_are_interrupted() -> None:
    runs = [run("a", RunStatus.RUNNING, 0), run("b", RunStatus.RUNNING, 1)]
    jobs = snapshots(runs, [row(0, "RUNNING", "a")], gone="its launcher has exited")
    for job in jobs.values():
        assert job.status is SweepJobStatus.INTERRUPTED
        assert job.error == "interrupted: its launcher has exited"
        assert job.duration_s is None
    assert jobs[0].start == NOW - 30 and jobs[1].start is None  # 1 never started


def test_ended_runs_say_why_in_one_line_and_pruned_trials_are_pruned() -> None:
    runs = [
        run("a", RunStatus.FINISHED, 0, {Tags.RETURN_VALUE: "json:0.25"}),
        run("b", RunStatus.FAILED, 1, {Tags.ERROR: "ValueError: bad\nmore"}),
        run("c", RunStatus.KILLED, 2, {Tags.ERROR: "launcher stopped"}),
        run("d", RunStatus.FINISHED, 3, {Tags.OPTUNA_STATE: "PRUNED"}),
    ]
    jobs = snapshots(runs, pruned={"d": 4})
    assert [(j.status.value, j.error) for j in jobs.values()] == [
        ("FINISHED", None),
        ("FAILED", "ValueError: bad"),
        ("KILLED", "stopped by the launcher"),
        ("PRUNED", "pruned at epoch 4"),
    ]
    assert jobs[0].return_value == 0.25 and jobs[0].duration_s == 50
    assert jobs[0].metrics == {"loss": 0.5} and jobs[0].overrides == ("x=0",)


def test_a_skipped_job_shows_the_run_it_was_taken_from() -> None:
    skipped = row(5, "FINISHED", "old", skipped=True, return_value=0.1, start=None)
    recorded = {"old": StoredRun(run("old", RunStatus.FINISHED, 0).record, None, {"acc": 0.9})}
    (job,) = snapshots([], [skipped], recorded=recorded).values()
    assert job.status is SweepJobStatus.SKIPPED and job.error is None
    assert job.return_value == 0.1 and job.metrics == {"acc": 0.9} and job.run_id == "old"


def test_without_a_store_a_running_row_is_checked_by_its_process() -> None:
    rows = [row(0, "RUNNING", None, pid=123)]
    (running,) = snapshots([], rows, alive=True).values()
    assert running.status is SweepJobStatus.RUNNING and running.duration_s == 30
    (gone,) = snapshots([], rows, alive=False).values()
    assert gone.status is SweepJobStatus.INTERRUPTED
    assert gone.error is not None and "its process is gone" in gone.error


# -- a real store -----------------------------------------------------------------------


@pytest.fixture
def store(mlflow_store: str) -> Iterator[RunStore]:
    opened = RunStore(resolve_tracking_uri(mlflow_store), "exp", 10, 60, sqlite_wal=True)
    try:
        yield opened
    finally:
        opened.close()


def record_pruned_sweep(store: RunStore, sweep_dir: Path) -> tuple[str, str]:
    """A sweep of one job whose Optuna trial was pruned at epoch 4, recorded as the launcher
    and the Optuna sweeper record one: its sweep run and job run."""
    import optuna

    from furcate_hydra.store.claims import ClaimRequest
    from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialRuns

    sweep_id = store.start_sweep("sweep", {Tags.SWEEP_DIR: str(sweep_dir)})
    tags = {Tags.FINGERPRINT: "fp", Tags.JOB_NUM: "0", Tags.OVERRIDES: "lr=0.1"}
    request = ClaimRequest("fp", "lr=0.1", {**tags, Tags.OUTPUT_DIR: str(sweep_dir / "0")}, {})
    (claim,) = store.claim([request])
    run_id = store.confirm(claim)
    store.finish_job_run(run_id, RunStatus.FINISHED, return_value=0.5)
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED,
        intermediate_values={epoch: 1.0 / (epoch + 1) for epoch in range(5)},
    )
    TrialRuns(store.tracking_uri, "study").annotate(run_id, trial)
    store.finish_sweep(RunStatus.FINISHED)
    return sweep_id, run_id


def test_a_pruned_trials_job_says_at_which_epoch(store: RunStore, tmp_path: Path) -> None:
    from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialTags

    assert (Tags.OPTUNA_STATE, INTERMEDIATE_METRIC) == (TrialTags.STATE, TrialTags.INTERMEDIATE)
    sweep_dir = tmp_path / "sweep"
    sweep_id, run_id = record_pruned_sweep(store, sweep_dir)
    record = SweepPointer(store.tracking_uri, store.experiment_id, "exp", sweep_id, NOW, 60)
    record.write(SweepPaths.of(sweep_dir).sweep_record)

    snapshot = SweepReader(sweep_dir).snapshot()
    (job,) = snapshot.jobs
    assert (job.status, job.error, job.run_id) == (
        SweepJobStatus.PRUNED,
        "pruned at epoch 4",
        run_id,
    )
    assert snapshot.status == "FINISHED" and snapshot.experiment == "exp"


def test_a_sweep_dir_without_its_record_is_found_by_its_tag(
    store: RunStore, tmp_path: Path
) -> None:
    # a sweep recorded before sweep dirs had furcate_sweep.json: the store it is in is given
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    _, run_id = record_pruned_sweep(store, sweep_dir)
    (job,) = SweepReader(sweep_dir, tracking_uri=store.tracking_uri).snapshot().jobs
    assert job.run_id == run_id and job.status is SweepJobStatus.PRUNED


def test_the_record_round_trips_and_a_broken_one_says_so(tmp_path: Path) -> None:
    from furcate_hydra.store.sweep_pointer import SweepPointerError

    path = tmp_path / "furcate_sweep.json"
    record = SweepPointer("sqlite:////x/mlflow.db", "1", "exp", "abc", 12.5, 60.0)
    record.write(path)
    assert SweepPointer.read(path) == record
    assert json.loads(path.read_text())["version"] == 1
    path.write_text('{"tracking_uri": 3}')
    with pytest.raises(SweepPointerError, match="is not a furcate sweep record"):
        SweepPointer.read(path)
