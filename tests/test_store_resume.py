"""Interrupted jobs continue from their last checkpoint in the same MLflow run.

A real sweep of a Lightning app (slow epochs) is interrupted mid-training, then run again
through the real CLI: finished configs are skipped, the interrupted job resumes at the epoch
after its last checkpoint, and each config ends with exactly one FINISHED run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from furcate_hydra.layout import JobPaths
from furcate_hydra.store import Tags
from tests.conftest import APPS, run_cli
from tests.process_helpers import wait_for
from tests.store_helpers import job_runs, sweep_runs

# Each test runs a Lightning sweep twice, interrupting the first.
pytestmark = pytest.mark.slow

# Job 0 finishes at once; job 1 needs 4 epochs of ~1.5 s, so it is mid-training when stopped.
SWEEP = ["-m", "epoch_sleep=0,1.5", "epochs=4"]


def start_sweep(tmp_path: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(APPS / "lightning_app.py"),
            *SWEEP,
            f"hydra.sweep.dir={tmp_path / name}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a shell gives a foreground job
    )


def mid_training(tmp_path: Path, uri: str, name: str) -> Callable[[], bool]:
    """Job 0 is FINISHED in the store and job 1 has saved at least two epochs."""
    pointer = tmp_path / name / "1" / JobPaths.CHECKPOINTS / "last.json"

    def ready() -> bool:
        if not pointer.exists() or json.loads(pointer.read_text())["epoch"] < 1:
            return False
        return any(r.info.status == "FINISHED" for r in job_runs(uri))

    return ready


def executed(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    log = tmp_path / name / "1" / JobPaths.CHECKPOINTS / "executed.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def interrupt(process: subprocess.Popen[str], how: signal.Signals) -> None:
    # The fork server and the jobs run in sessions of their own: follow them by ancestry.
    descendants = psutil.Process(process.pid).children(recursive=True)
    assert len(descendants) >= 2, "expected the fork server and running jobs"
    if how is signal.SIGKILL:
        process.kill()  # the launcher alone, as the OOM killer would
    else:
        os.killpg(os.getpgid(process.pid), how)  # Ctrl-C reaches the foreground group
    process.wait(timeout=60)
    # The fork server notices its launcher is gone and stops every job.
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, f"outlived their launcher: {alive}"


def rerun(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    result = run_cli(
        APPS / "lightning_app.py", *SWEEP, f"hydra.sweep.dir={tmp_path / 'second'}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_job_resumes_from_its_checkpoint(
    tmp_path: Path, mlflow_store: str, how: signal.Signals
) -> None:
    process = start_sweep(tmp_path, "first")
    wait_for(mid_training(tmp_path, mlflow_store, "first"), process, "job 1 to be mid-training")
    saved_epoch = json.loads(
        (tmp_path / "first" / "1" / JobPaths.CHECKPOINTS / "last.json").read_text()
    )["epoch"]
    interrupt(process, how)
    before = {r.data.tags[Tags.FINGERPRINT]: r for r in job_runs(mlflow_store)}
    interrupted = next(r for r in before.values() if r.info.status != "FINISHED")
    # SIGKILL leaves the run RUNNING (nobody could record anything); Ctrl-C records KILLED.
    assert interrupted.info.status == ("RUNNING" if how is signal.SIGKILL else "KILLED")
    first_pid = executed(tmp_path, "first")[0]["pid"]

    result = rerun(tmp_path)
    output = result.stdout + result.stderr
    assert "skipped 1 of 2 configs" in output
    assert f"resumes MLflow run {interrupted.info.run_id}" in output
    # the finished config did not run again: its job dir only records where it ran
    assert not (tmp_path / "second" / "0" / "stdout.log").exists()
    skipped = json.loads((tmp_path / "second" / "0" / "run_data.json").read_text())
    assert skipped["skipped"] is True
    assert skipped["recorded_output_dir"] == str(tmp_path / "first" / "0")
    # the resumed job's dir links to its run's checkpoints, which stay where they were made
    link = tmp_path / "second" / "1" / JobPaths.CHECKPOINTS
    assert link.is_symlink() and link.resolve() == (tmp_path / "first" / "1" / JobPaths.CHECKPOINTS)

    # The resumed process ran only the epochs after the last checkpoint (epochs may have
    # been saved after `saved_epoch` was read, before the kill landed).
    rows = executed(tmp_path, "first")  # same checkpoint dir: the run's, from the first sweep
    second_run = [row["epoch"] for row in rows if row["pid"] != first_pid]
    first_run = [row["epoch"] for row in rows if row["pid"] == first_pid]
    assert second_run and second_run[0] >= saved_epoch + 1
    assert second_run == list(range(second_run[0], 4))
    assert second_run[0] <= max(first_run) + 1
    history = json.loads((tmp_path / "second" / "1" / "history.json").read_text())
    assert [row["epoch"] for row in history] == [0, 1, 2, 3]

    after = job_runs(mlflow_store)
    assert len(after) == 2 and all(r.info.status == "FINISHED" for r in after)
    by_fp = {r.data.tags[Tags.FINGERPRINT]: r for r in after}
    assert by_fp.keys() == before.keys()  # exactly one run per fingerprint: the same ones
    resumed = by_fp[interrupted.data.tags[Tags.FINGERPRINT]]
    assert resumed.info.run_id == interrupted.info.run_id
    assert resumed.data.tags[Tags.RESUMED] == "1"
    assert json.loads(resumed.data.tags[Tags.RETURN_VALUE].removeprefix("json:"))["epochs"] == 4
    # Ctrl-C: the launcher ended its sweep's run KILLED; SIGKILL: the rerun did, finding its
    # launcher gone
    statuses = sorted(r.info.status for r in sweep_runs(mlflow_store))
    assert statuses == ["FINISHED", "KILLED"]


def test_corrupt_checkpoint_is_moved_aside_and_the_job_resumes_from_the_older_one(
    tmp_path: Path, mlflow_store: str
) -> None:
    process = start_sweep(tmp_path, "first")
    wait_for(mid_training(tmp_path, mlflow_store, "first"), process, "job 1 to be mid-training")
    interrupt(process, signal.SIGKILL)
    checkpoints = tmp_path / "first" / "1" / JobPaths.CHECKPOINTS
    pointer = json.loads((checkpoints / "last.json").read_text())
    named = checkpoints / pointer["file"]
    named.write_bytes(b"not a checkpoint")
    older = pointer["previous"][0]  # two epochs saved: the one before is kept
    finished_before = [r for r in job_runs(mlflow_store) if r.info.status == "FINISHED"]
    first_pid = executed(tmp_path, "first")[0]["pid"]

    result = rerun(tmp_path)
    output = result.stdout + result.stderr
    job_log = (tmp_path / "second" / "1" / "stderr.log").read_text()
    assert f"Cannot resume from {named}" in job_log, job_log
    assert f"Resuming from the older {older['file']}" in job_log, job_log
    assert (checkpoints / f"{named.name}.corrupt").read_bytes() == b"not a checkpoint"
    second_run = [row["epoch"] for row in executed(tmp_path, "first") if row["pid"] != first_pid]
    assert second_run == list(range(older["epoch"] + 1, 4))
    assert "skipped 1 of 2 configs" in output
    after = job_runs(mlflow_store)
    assert len(after) == 2 and all(r.info.status == "FINISHED" for r in after)
    # The run that had finished is untouched.
    (kept,) = [r for r in after if r.info.run_id == finished_before[0].info.run_id]
    assert kept.data.tags[Tags.RETURN_VALUE] == finished_before[0].data.tags[Tags.RETURN_VALUE]
    assert kept.info.end_time == finished_before[0].info.end_time
