"""Lightning jobs in a real sweep: preempted by a real signal, or lost with their machine, they
resume where they stopped and end with the weights of the same training left alone.

Each sweep runs two configs of ``preempt_app.py`` that train alike: ``pause_s=0`` finishes
undisturbed (the reference), ``pause_s=0.25`` is slow enough to be hit mid-epoch. Which batches
each process trained is read from ``executed.jsonl`` in the job's checkpoint dir.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from furcate_hydra.layout import JobPaths
from furcate_hydra.store import Tags
from tests.conftest import APPS, run_cli
from tests.process_helpers import killed_if_left, start_sweep, wait_for
from tests.store_helpers import job_runs

# each test trains two small models through the real CLI, one twice (~30-60 s here)
pytestmark = pytest.mark.slow

SWEEP = ["pause_s=0,0.25"]
SLOW_JOB = "1"


def rows(tmp_path: Path, sweep: str = "sweep") -> list[dict[str, int]]:
    log = tmp_path / sweep / SLOW_JOB / JobPaths.CHECKPOINTS / "executed.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def by_pid(executed: list[dict[str, int]]) -> list[list[dict[str, int]]]:
    """The rows of each process that trained the job, in the order the processes ran."""
    pids = list(dict.fromkeys(row["pid"] for row in executed))
    return [[row for row in executed if row["pid"] == pid] for pid in pids]


def returned(run: Any) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(run.data.tags[Tags.RETURN_VALUE].removeprefix("json:"))
    return value


def runs_by_job(uri: str) -> dict[str, Any]:
    return {run.data.tags[Tags.JOB_NUM]: run for run in job_runs(uri)}


def test_sigterm_to_a_job_saves_at_once_and_it_resumes_in_the_same_sweep(
    tmp_path: Path, mlflow_store: str
) -> None:
    with killed_if_left(start_sweep("preempt_app.py", tmp_path, *SWEEP)) as process:
        # mid-epoch 1 (8 batches an epoch), then the signal, as a scheduler sends it
        wait_for(lambda: len(rows(tmp_path)) >= 11, process, "the slow job to reach epoch 1", 180)
        os.kill(rows(tmp_path)[0]["pid"], signal.SIGTERM)
        _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()

    first, second = by_pid(rows(tmp_path))
    # saved at the end of the step the signal interrupted; the next process trains the next
    # batch: nothing repeated, nothing skipped
    assert second[0]["step"] == first[-1]["step"] + 1
    assert [r["step"] for r in first + second] == list(range(24))
    runs = runs_by_job(mlflow_store)
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs.values())
    slow, reference = runs[SLOW_JOB], runs["0"]
    assert slow.data.tags[Tags.PREEMPTIONS] == "1"
    epoch, batch = returned(slow)["resumed_at"]
    assert epoch * 8 + batch == second[0]["step"]
    assert returned(slow)["weights"] == returned(reference)["weights"]  # bitwise equal
    assert "1 preemption" in (tmp_path / "sweep" / "summary.md").read_text()


def test_a_lost_machine_resumes_from_the_last_step_checkpoint(
    tmp_path: Path, mlflow_store: str
) -> None:
    every = 3
    options = [*SWEEP, f"hydra.launcher.checkpoint_every_n_steps={every}"]
    pointer_path = tmp_path / "sweep" / SLOW_JOB / JobPaths.CHECKPOINTS / "last.json"

    def mid_epoch_checkpoint_saved() -> bool:
        if len(rows(tmp_path)) < 11 or not pointer_path.exists():
            return False
        return json.loads(pointer_path.read_text())["batch"] is not None

    with killed_if_left(start_sweep("preempt_app.py", tmp_path, *options)) as process:
        wait_for(mid_epoch_checkpoint_saved, process, "a step checkpoint of the slow job", 180)
        # everything at once, as a power cut: the launcher, its fork server, the jobs
        tree = [process.pid, *(c.pid for c in psutil.Process(process.pid).children(True))]
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        process.wait()
    pointer = json.loads(pointer_path.read_text())
    (first,) = by_pid(rows(tmp_path))

    rerun = run_cli(
        APPS / "preempt_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'again'}",
        *options,
        cwd=tmp_path,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    first_again, second = by_pid(rows(tmp_path))  # the run's checkpoint dir, in the first sweep
    assert first_again == first
    # it resumed at the step after its last step checkpoint: at most `every` batches repeat
    assert second[0]["step"] == pointer["global_step"]
    assert first[-1]["step"] - second[0]["step"] + 1 <= every
    assert second[-1]["step"] == 23
    runs = runs_by_job(mlflow_store)
    assert all(r.info.status == "FINISHED" for r in runs.values())
    assert returned(runs[SLOW_JOB])["weights"] == returned(runs["0"])["weights"]


def test_the_launchers_own_sigterm_saves_but_is_not_a_preemption(
    tmp_path: Path, mlflow_store: str
) -> None:
    with killed_if_left(start_sweep("preempt_app.py", tmp_path, *SWEEP)) as process:
        # early in epoch 1: the launcher's stop reaches the job well before the epoch ends
        wait_for(lambda: len(rows(tmp_path)) >= 9, process, "the slow job to reach epoch 1", 180)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the launcher stops its jobs
        process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT

    (first,) = by_pid(rows(tmp_path))  # not queued again
    slow = runs_by_job(mlflow_store)[SLOW_JOB]
    assert slow.info.status == "KILLED"
    assert Tags.PREEMPTIONS not in slow.data.tags
    # the job still saved where it was when the launcher's SIGTERM came: a rerun resumes there
    pointer = json.loads(
        (tmp_path / "sweep" / SLOW_JOB / JobPaths.CHECKPOINTS / "last.json").read_text()
    )
    assert pointer["batch"] is not None
    assert pointer["global_step"] == first[-1]["step"] + 1
