"""The crash matrix: every way a job can fail becomes a FAILED JobReturn; the others finish."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra.core.utils import JobStatus

from furcate_hydra.errors import JobCrashedError
from tests.conftest import LaunchJobs, run_probe_sweep

MODES = ["ok", "raise", "exit", "os_exit", "sigkill", "segfault", "unpicklable", "ok"]
EXPECTED = {
    "raise": (ValueError, "the task raised on purpose"),
    "exit": (JobCrashedError, "sys.exit(3)"),
    "os_exit": (JobCrashedError, "exited with code 4 before reporting a result"),
    "sigkill": (JobCrashedError, "killed by SIGKILL (exit code -9)"),
    "segfault": (JobCrashedError, "killed by SIGSEGV (exit code -11)"),
    "unpicklable": (JobCrashedError, "could not be pickled"),
}


def test_crash_matrix_fails_only_the_broken_jobs(launch_jobs: LaunchJobs) -> None:
    returns = launch_jobs([[f"mode={mode}"] for mode in MODES], ["hydra.launcher.gpus=[0,1]"])

    assert [r.overrides for r in returns] == [[f"mode={mode}"] for mode in MODES]
    for mode, job_return in zip(MODES, returns, strict=True):
        assert job_return.hydra_cfg is not None
        log_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir)
        if mode == "ok":
            assert job_return.status is JobStatus.COMPLETED
            assert job_return.return_value["cuda_visible_devices"] in {"0", "1"}
            continue
        assert job_return.status is JobStatus.FAILED, mode
        error_type, words = EXPECTED[mode]
        with pytest.raises(error_type) as caught:
            _ = job_return.return_value
        message = str(caught.value) + str(caught.value.__cause__ or "")
        assert words in message, (mode, message)
        # the error points at the job's logs, and they hold what the job printed first
        assert str(log_dir / "stderr.log") in message, (mode, message)
        assert f"about to {mode}" in (log_dir / "stdout.log").read_text()
        assert f"stderr line before {mode}" in (log_dir / "stderr.log").read_text()


def test_a_raised_error_keeps_its_type_and_remote_traceback(launch_jobs: LaunchJobs) -> None:
    (job_return,) = launch_jobs([["mode=raise"]], [])
    with pytest.raises(ValueError, match="the task raised on purpose") as caught:
        _ = job_return.return_value
    cause = str(caught.value.__cause__)
    assert "Traceback from the job's process" in cause
    assert "probe_app.py" in cause and "in misbehave" in cause


def test_crashed_job_is_retried_when_asked(launch_jobs: LaunchJobs, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    os.environ["PROBE_MARKER_DIR"] = str(markers)
    try:
        (retried,) = launch_jobs([["mode=crash_once"]], ["hydra.launcher.max_retries=1"])
        assert retried.status is JobStatus.COMPLETED
        assert retried.return_value == "recovered"
        assert len(list(markers.glob("crashed-*"))) == 1
        for marker in markers.iterdir():
            marker.unlink()
        (not_retried,) = launch_jobs(
            [["mode=crash_once"]], ["hydra.launcher.max_retries=0", "hydra.launcher.rerun=all"]
        )
        assert not_retried.status is JobStatus.FAILED
    finally:
        del os.environ["PROBE_MARKER_DIR"]


@pytest.mark.usefixtures("mlflow_store")
def test_cli_sweep_with_a_failing_job_still_finishes_the_others(tmp_path: Path) -> None:
    # three distinct configs: one listed twice would run once (its twin waits for its run)
    result = run_probe_sweep(tmp_path, "mode=ok,segfault,metric")
    # Hydra's BasicSweeper re-raises the first failure once the whole batch is done.
    assert result.returncode == 1
    assert "killed by SIGSEGV" in result.stderr
    assert (tmp_path / "sweep" / "0" / "probe.json").exists()
    assert (tmp_path / "sweep" / "2" / "probe.json").exists()
