"""A job preempted from outside (SIGTERM or SIGUSR1 the launcher did not send) is queued again
into the same MLflow run, up to hydra.launcher.max_preemptions times; the sweep still exits 0.

The probe app's job signals itself, as a scheduler would signal it; a plain task (no ``fit``)
dies of the signal, which the launcher reads as a preemption too. Lightning jobs, which save
a checkpoint first, are in ``test_preemption_resume.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import run_probe_sweep
from tests.store_helpers import job_runs


def preempting_sweep(tmp_path: Path, *overrides: str) -> tuple[int, str, Path]:
    """The probe app's sweep, its preempting jobs marking themselves in a folder: the exit
    status, the output, and that folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    result = run_probe_sweep(tmp_path, *overrides, env={"PROBE_MARKER_DIR": str(markers)})
    return result.returncode, result.stdout + result.stderr, markers


@pytest.mark.parametrize(
    ("mode", "signal_name"),
    [
        ("sigterm_once", "SIGTERM"),
        pytest.param("sigusr1_once", "SIGUSR1", marks=pytest.mark.slow),  # CI runs it
    ],
)
def test_a_preempted_job_runs_again_in_its_run_and_the_sweep_exits_0(
    tmp_path: Path, mlflow_store: str, mode: str, signal_name: str
) -> None:
    returncode, out, _ = preempting_sweep(tmp_path, f"mode=ok,{mode}")
    assert returncode == 0, out
    assert f"preempted by {signal_name}" in out
    assert "queued again to resume (preemption 1 of 3)" in out
    assert "sweep of 2 jobs: 2 finished" in out
    assert "1 preemption: each time the job was queued again" in out
    assert "1 preemption" in (tmp_path / "sweep" / "summary.md").read_text()

    runs = job_runs(mlflow_store)
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)  # no new run
    (preempted,) = [r for r in runs if r.data.tags[Tags.JOB_NUM] == "1"]
    assert preempted.data.tags[Tags.PREEMPTIONS] == "1"
    assert preempted.data.tags[Tags.RETURN_VALUE] == 'json:"recovered"'
    run_data = json.loads((tmp_path / "sweep" / "1" / "run_data.json").read_text())
    assert (run_data["attempts"], run_data["preemptions"]) == (2, 1)


def test_a_job_preempted_more_often_than_allowed_ends_resumable(
    tmp_path: Path, mlflow_store: str
) -> None:
    returncode, out, markers = preempting_sweep(
        tmp_path, "mode=sigterm_always", "hydra.launcher.max_preemptions=1"
    )
    assert returncode != 0
    assert len(list(markers.glob("preempted-*"))) == 2  # queued again once, then not
    assert "job #0 preempted: preempted 2 times, more than hydra.launcher.max_preemptions=1" in out
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "| preempted | 1 |" in summary
    (run,) = job_runs(mlflow_store)
    # KILLED, as an interrupted run: the next run of the sweep resumes it
    assert run.info.status == "KILLED"
    assert run.data.tags[Tags.PREEMPTIONS] == "2"
    assert "run the same command to resume it" in run.data.tags[Tags.ERROR]


@pytest.mark.slow  # CI runs it; a sweep of four jobs one after another
def test_a_preempted_job_runs_after_the_job_forked_ahead_of_it_and_before_the_rest(
    tmp_path: Path, mlflow_store: str
) -> None:
    # One slot. While job #0 runs, #1 is forked ahead, waiting at its gate. #0 is preempted:
    # the fork server hands its slot to #1 at once, and #0 is queued again first, so it runs
    # before #2 and #3; nothing is left waiting at a gate (the sweep ends).
    returncode, out, _ = preempting_sweep(
        tmp_path, "mode=sigterm_once,ok", "+i=0,1", "sleep=1", "hydra.launcher.gpus=[3]"
    )
    assert returncode == 0, out
    assert "queued again to resume (preemption 1 of 3)" in out
    assert "sweep of 4 jobs: 4 finished" in out
    started = {
        i: json.loads((tmp_path / "sweep" / str(i) / "probe.json").read_text())["started_at"]
        for i in range(4)
    }  # #0's is its second attempt's
    assert started[1] < started[0] < started[2] < started[3]
    run_data = json.loads((tmp_path / "sweep" / "0" / "run_data.json").read_text())
    assert (run_data["attempts"], run_data["preemptions"]) == (2, 1)
    assert sorted(run.info.status for run in job_runs(mlflow_store)) == ["FINISHED"] * 4
