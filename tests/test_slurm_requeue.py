"""A sweep inside a Slurm allocation whose time runs out: saved, requeued, resumed.

``sbatch --time=2 --signal=B:USR1@90 --requeue job.sh``, job.sh ``exec``-ing the sweep of
``preempt_app.py``: ``pause_s=0`` finishes at once (the reference), ``pause_s=3`` trains ~72 s
and is still training when Slurm (which checks time limits every 30 s) sends SIGUSR1 30-60 s
in. The launcher stops its job (it saves a checkpoint at the step), records it preempted and
requeues its own Slurm job; the same job id runs again, skips the reference and resumes the
slow job at the next step. Which batches each process trained is read from
``executed.jsonl`` in the job's checkpoint dir.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from furcate_hydra.layout import JobPaths
from furcate_hydra.store import Tags
from tests.conftest import APPS
from tests.slurm_cluster import SlurmCluster, sweep_script, wait_until
from tests.store_helpers import job_runs, sweep_runs
from tests.test_preemption_resume import by_pid, returned

# ~1.5-2 minutes: Slurm checks time limits every 30 s
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def executed(sweep: Path, job: str) -> list[dict[str, int]]:
    path = sweep / job / JobPaths.CHECKPOINTS / "executed.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def stamp(log: str, text: str) -> float:
    """When the first log line containing ``text`` was written."""
    for line in log.splitlines():
        match = _STAMP.match(line)
        if match and text in line:
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no log line says {text!r}:\n{log}")


def test_time_limit_saves_requeues_and_the_requeued_job_resumes(
    slurm: SlurmCluster, tmp_path: Path, mlflow_store: str
) -> None:
    sweep = tmp_path / "sweep"
    # the requeued run finds its jobs' dirs where they were: a fixed sweep dir
    script = sweep_script(
        tmp_path, APPS / "preempt_app.py", mlflow_store, "pause_s=0,3", f"hydra.sweep.dir={sweep}"
    )
    out = tmp_path / "slurm.out"
    started = time.time()
    job = slurm.sbatch(
        "--gres=gpu:2",
        "--cpus-per-task=2",
        "--time=2",
        "--signal=B:USR1@90",
        "--requeue",
        "--open-mode=append",  # both runs' output in one file
        f"--output={out}",
        f"--chdir={tmp_path}",
        str(script),
    )
    wait_until(lambda: slurm.job_state(job).get("JobState") == "COMPLETED", "the sweep", 240)
    state = slurm.job_state(job)
    log = out.read_text()
    assert state.get("Restarts") == "1", (state, log)  # requeued once, by the launcher

    signalled = stamp(log, "reached its time limit (SIGUSR1)")
    assert "1 job stopped at a checkpoint and recorded preempted; requeued" in log, log
    resumed = stamp(log, "resumes MLflow run")
    print(
        f"\nSIGUSR1 handled {signalled - started:.1f} s after sbatch; "
        f"the requeued run resumed the job {resumed - signalled:.1f} s after it"
    )

    first, second = by_pid(executed(sweep, "1"))
    # saved at the end of the step SIGUSR1 interrupted; the requeued run trains the next
    # batch: nothing trained twice, nothing skipped
    assert second[0]["step"] == first[-1]["step"] + 1
    assert [r["step"] for r in first + second] == list(range(24))
    assert len(by_pid(executed(sweep, "0"))) == 1  # finished before: skipped when requeued

    runs = {run.data.tags[Tags.JOB_NUM]: run for run in job_runs(mlflow_store)}
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs.values())
    slow, reference = runs["1"], runs["0"]
    assert slow.data.tags[Tags.PREEMPTIONS] == "1"
    assert slow.data.tags[Tags.RESUMED] == "1" and Tags.RESUMED not in reference.data.tags
    assert returned(slow)["weights"] == returned(reference)["weights"]  # exactly, bitwise
    # the first run's sweep run was preempted; the requeued one ran the sweep to its end
    statuses = sorted(r.info.status for r in sweep_runs(mlflow_store))
    assert statuses == ["FINISHED", "KILLED"], statuses
