"""The launcher's asynchronous path: results come back as jobs finish, not in batches."""

from __future__ import annotations

from pathlib import Path

from hydra.core.utils import JobStatus

from furcate_hydra.execution.executor import EventKind, JobEvent
from furcate_hydra.launching.streaming import JobRequest
from tests.conftest import LaunchJobs


def test_fast_job_result_returns_while_slow_job_runs(launch_jobs: LaunchJobs) -> None:
    # A one-job launch builds the launcher and warms its pool; reuse that launcher.
    (warm,) = launch_jobs([["sleep=0"]], ["hydra.launcher.gpus=[0,1]"])
    assert warm.status is JobStatus.COMPLETED
    launcher = launch_jobs.last

    slow, fast = launcher.submit_batch([JobRequest(["sleep=3"], 1), JobRequest(["sleep=0.2"], 2)])
    first = launcher.wait_any()
    assert [key for key, _ in first] == [fast]  # not held back until the slow job ends
    ((_, job_return),) = first
    assert job_return.status is JobStatus.COMPLETED
    assert job_return.hydra_cfg is not None and job_return.hydra_cfg.hydra.job.num == 2

    # the freed slot takes new work at once while the slow job still runs
    (third,) = launcher.submit_batch([JobRequest(["sleep=0.2"], 3)])
    assert [key for key, _ in launcher.wait_any()] == [third]
    assert [key for key, _ in launcher.wait_any()] == [slow]


def test_launch_numbers_jobs_from_initial_index(launch_jobs: LaunchJobs, tmp_path: Path) -> None:
    returns = launch_jobs([["+i=0"], ["+i=1"], ["+i=2"]], ["hydra.launcher.gpus=[0]"])
    assert [r.hydra_cfg.hydra.job.num for r in returns if r.hydra_cfg] == [0, 1, 2]
    assert [r.return_value["num"] for r in returns] == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1", "2"]


def test_progress_a_running_job_reports_reaches_the_executors_listeners(
    launch_jobs: LaunchJobs,
) -> None:
    (warm,) = launch_jobs([["sleep=0"]], ["hydra.launcher.gpus=[0]"])
    assert warm.status is JobStatus.COMPLETED
    launcher = launch_jobs.last
    events: list[JobEvent] = []
    launcher.session().executor.add_listener(events.append)

    (key,) = launcher.submit_batch([JobRequest(["mode=progress"], 1)])
    assert [k for k, _ in launcher.wait_any(timeout=30)] == [key]
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.ENDED
    reported = [e.progress for e in events if e.kind is EventKind.PROGRESS]
    assert [(p.epoch, p.step, p.metrics) for p in reported if p is not None] == [
        (0, 10, {"loss": 1.0}),
        (1, 20, {"loss": 0.5}),
    ]
