"""A fork server that dies breaks the pool loudly: every held job fails with the reason, later
submits raise, the runs are recorded, and no job process is left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from hydra.core.utils import JobStatus

from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution.executor import EventKind, JobEvent
from furcate_hydra.execution.forkserver.names import SERVER_NAME
from furcate_hydra.execution.local_pool import LocalPool
from furcate_hydra.launching.streaming import JobRequest
from furcate_hydra.store import Tags
from tests.conftest import LaunchJobs
from tests.process_helpers import (
    alive,
    killed_if_left,
    start_probe_sweep,
    still_alive,
    wait_for_descendants,
)
from tests.store_helpers import job_runs, sweep_runs

LOST = "The fork server stopped unexpectedly"


def test_a_killed_fork_server_fails_every_held_job_and_refuses_more(
    launch_jobs: LaunchJobs, mlflow_store: str
) -> None:
    (warm,) = launch_jobs([["sleep=0"]], ["hydra.launcher.gpus=[0,1]"])
    assert warm.status is JobStatus.COMPLETED
    launcher = launch_jobs.last
    pool = launcher.session().executor
    assert isinstance(pool, LocalPool)
    events: list[JobEvent] = []
    pool.add_listener(events.append)

    requests = [JobRequest(["sleep=60", f"+i={i}"], 10 + i) for i in range(3)]
    keys = launcher.submit_batch(requests)  # two slots: two run, one waits in the queue
    deadline = time.monotonic() + 30
    while sum(e.kind is EventKind.STARTED for e in events) < 2 and time.monotonic() < deadline:
        assert launcher.wait_any(timeout=0.1) == []
    started = [e.job.pid for e in events if e.kind is EventKind.STARTED]
    assert len(started) == 2 and all(pid is not None and alive(pid) for pid in started)

    os.kill(pool.server_pid, signal.SIGKILL)
    returns: dict[str, object] = {}
    while len(returns) < 3:
        returns.update(launcher.wait_any(timeout=30))
    assert sorted(returns) == sorted(keys)
    for key in keys:
        job_return = returns[key]
        assert job_return.status is JobStatus.FAILED  # type: ignore[attr-defined]
        message = str(job_return._return_value)  # type: ignore[attr-defined]
        assert f"Job #{key}" in message and "lost" in message and LOST in message
        assert "stdout.log" in message  # the failure points at the job's logs
    assert [e.job.key for e in events if e.kind is EventKind.ENDED] == keys
    assert still_alive([pid for pid in started if pid is not None]) == []

    with pytest.raises(ExecutorBrokenError, match="the local slot pool is broken"):
        launcher.submit_batch([JobRequest(["sleep=0", "+i=9"], 20)])

    runs = {r.data.tags[Tags.JOB_NUM]: r for r in job_runs(mlflow_store)}
    for num in ("10", "11", "12", "20"):
        assert runs[num].info.status == "FAILED"
        assert LOST in runs[num].data.tags[Tags.ERROR]
    assert runs["0"].info.status == "FINISHED"  # what ended before the break stays recorded


def test_a_sweep_whose_fork_server_dies_stops_with_the_reason_and_records_it(
    tmp_path: Path, mlflow_store: str
) -> None:
    process = start_probe_sweep(
        tmp_path,
        "hydra/sweeper=furcate",
        "mode=spawn_and_hang",
        "+i=0,1,2",
        "hydra.launcher.gpus=[0,1]",
    )
    with killed_if_left(process):
        launcher = psutil.Process(process.pid)
        # fork server + 2 jobs + 2 children per job
        descendants = wait_for_descendants(launcher, 7, timeout=60)
        server = None
        for child in launcher.children():
            # a fork of the launcher, named so; or, where it cannot fork, a fresh interpreter
            command = " ".join(child.cmdline())
            if child.name() == SERVER_NAME or "forkserver.entry import" in command:
                server = child.pid
        assert server is not None and len(descendants) >= 7
        os.kill(server, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=60)
    text = (stdout + stderr).decode()  # the log (stdout), and the error the sweep ends with
    assert process.returncode != 0
    assert "the local slot pool is broken" in text and LOST in text
    assert still_alive(descendants) == []
    runs = job_runs(mlflow_store)
    # the two jobs that were running, and the third, submitted ahead of a slot
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED", "FAILED"]
    assert all(LOST in r.data.tags[Tags.ERROR] for r in runs)
    assert [r.info.status for r in sweep_runs(mlflow_store)] == ["FAILED"]
