"""The end-of-sweep summary and the failures said as they happen, from real crashing jobs;
fail_fast stops new jobs at the first failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.monitor.summary import SweepSummary, Unfinished
from tests.conftest import RunStudy, run_probe_sweep
from tests.option_helpers import parse_launcher_options
from tests.store_helpers import job_runs

# each way a job can end, with the one-line reason the summary gives it
CRASH_MATRIX = {
    "raise": ("failed", "ValueError: the task raised on purpose"),
    "exit": ("failed", "sys.exit(3)"),
    "os_exit": ("crashed", "os._exit(4)"),  # died without reporting
    "sigkill": ("killed", "killed by SIGKILL"),
    "segfault": ("crashed", "segfault (SIGSEGV)"),
}


@pytest.mark.usefixtures("mlflow_store")
def test_the_summary_names_every_failure_mode(tmp_path: Path) -> None:
    modes = ",".join(["ok", *CRASH_MATRIX])
    result = run_probe_sweep(tmp_path, f"mode={modes}")
    assert result.returncode != 0  # Hydra's non-zero exit when a job failed is kept
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    out = result.stdout
    assert "sweep of 6 jobs: 1 finished, 2 failed, 2 crashed, 1 killed" in out
    for num, (mode, (outcome, reason)) in enumerate(CRASH_MATRIX.items(), start=1):
        logs = tmp_path / "sweep" / str(num) / "stderr.log"
        # said when it happened, and again in the summary and in summary.md
        assert f"furcate: job #{num} {outcome}: {reason} (logs: {logs})" in out
        assert f"  #{num} {outcome}: {reason}\n      mode={mode} | logs: {logs}" in out
        assert f"| #{num} | {outcome} | {reason} | mode={mode} | {logs} |" in summary
    assert "| finished | 1 |" in summary and "| killed | 1 |" in summary


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (a sweep and its rerun)
@pytest.mark.usefixtures("mlflow_store")
def test_the_summary_gives_the_range_of_numeric_returns_and_counts_skips(
    tmp_path: Path,
) -> None:
    first = run_probe_sweep(tmp_path, "mode=value", "+lr=0.5,0.1,0.9")
    assert first.returncode == 0, first.stderr
    again = run_probe_sweep(tmp_path, "mode=value", "+lr=0.5,0.1,0.9,0.3")
    assert again.returncode == 0, again.stderr
    assert "sweep of 4 jobs: 1 finished, 3 skipped" in again.stdout
    assert "return values: lowest 0.1 (job #1), highest 0.9 (job #2)" in again.stdout


def test_summary_rows_escape_table_cells() -> None:
    summary = SweepSummary()
    summary.finished(0, 2.5)
    summary.did_not_finish(Unfinished(1, "a=x|y", "failed", "ValueError: a|b", "/l"))
    assert "| #1 | failed | ValueError: a\\|b | a=x\\|y | /l |" in summary.markdown()
    assert summary.values_line(best=None) == "return value: 2.5 (job #0)"
    assert summary.values_line(best="0.1 (trial 3)") == "best: 0.1 (trial 3)"


def test_a_bad_fail_fast_value_stops_the_cli_before_any_job(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "+i=1,2", "hydra.launcher.fail_fast=maybe")
    assert result.returncode != 0
    assert "fail_fast" in result.stderr and "maybe" in result.stderr
    assert not (tmp_path / "sweep" / "0").exists()


def test_the_fail_fast_check_names_the_key() -> None:
    options = {"fail_fast": "yes", "mlflow": {"enabled": False}}
    with pytest.raises(FurcateConfigError, match=r"hydra.launcher.fail_fast='yes'.*true or false"):
        parse_launcher_options(options)


def test_fail_fast_starts_nothing_after_the_first_failure(
    tmp_path: Path, mlflow_store: str
) -> None:
    result = run_probe_sweep(
        tmp_path,
        "hydra/sweeper=furcate",
        "mode=raise,ok",
        "+i=1,2,3",
        "sleep=1",
        "hydra.launcher.fail_fast=true",
    )
    assert result.returncode != 0
    assert "fail_fast: 0 queued job(s) and any the sweeper submits are not started" in result.stdout
    # jobs 0 and 1 (both mode=raise) ran side by side; 2-5 never started and have no run
    assert "sweep of 6 jobs: 2 failed, 4 not started" in result.stdout
    assert len(job_runs(mlflow_store)) == 2
    assert not (tmp_path / "sweep" / "2" / "stdout.log").exists()


def test_the_summary_names_the_highest_memory_peaks_and_their_jobs() -> None:
    summary = SweepSummary()
    assert summary.peaks_line() is None  # nothing traced: no line
    summary.peaks(0, 812.4, None)
    summary.peaks(1, 2048.0, 5120.0)
    summary.peaks(2, 1000.0, 6000.6)
    line = "peak memory of a job: 2,048 MiB resident (job #1), 6,001 MiB on its GPU (job #2)"
    assert summary.peaks_line() == line
    assert f"\n  {line}" in summary.text() and f"\n\n{line}\n" in summary.markdown()


@pytest.mark.parametrize("asynchronous", ["true", "false"])
def test_a_pruned_jobs_row_says_at_which_epoch(
    tmp_path: Path, run_study_in_process: RunStudy, asynchronous: str
) -> None:
    # false: hydra-optuna-sweeper's batch loop tells the trials after the launch returned,
    # and summary.md is written again
    run_study_in_process(
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.monitor=loss",
        f"hydra.sweeper.asynchronous={asynchronous}",
        "+prune_at=3",
    )
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "| pruned | 2 |" in summary
    for num in (0, 1):
        logs = tmp_path / "sweep" / str(num) / "stderr.log"
        assert f"| #{num} | pruned | pruned at epoch 3 | " in summary
        assert f" | {logs} |" in summary
