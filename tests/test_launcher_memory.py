"""The launcher process keeps nothing per finished job: a sweep of many jobs ends holding no more
Jobs, JobReturns, run data rows or configs than a sweep of one would.

Counted with ``gc`` by a Hydra callback in the process that runs the sweeper and the launcher
(``tests/live_objects.py``), at the multirun's end, while the sweeper's returns are still held.
Each job's JobReturn carries two whole configs (~100 KB); held per job, they are what grew the
launcher by ~125 KB a job.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_optuna_study, run_probe_sweep

# slow (hundreds of jobs per test): CI runs them, the quick suite leaves them out
pytestmark = [pytest.mark.usefixtures("mlflow_store"), pytest.mark.slow]

JOBS = 100


def callback(tmp_path: Path) -> list[str]:
    out = tmp_path / "live_objects.json"
    return [
        "+hydra.callbacks.live_objects._target_=tests.live_objects.LiveObjects",
        f"+hydra.callbacks.live_objects.out={out}",
    ]


def live_objects(tmp_path: Path) -> dict[str, tuple[int, int]]:
    """``{class name: (count at the multirun's start, count at its end)}``."""
    counts = json.loads((tmp_path / "live_objects.json").read_text())
    return {name: (start, end) for name, (start, end) in counts.items()}


def assert_nothing_kept_per_job(counts: dict[str, tuple[int, int]], jobs: int) -> None:
    assert counts["Job"][1] == 0, counts
    assert counts["JobRow"][1] == 0, counts
    assert counts["TrialJob"][1] == 0, counts
    assert counts["JobReturn"][1] <= 1, counts  # at most the first failure's, raised at the end
    # A JobReturn's two configs are ~50 DictConfig nodes; fewer than one per job are the
    # sweep's own (its search space, say)
    start, end = counts["DictConfig"]
    assert end - start < jobs, counts


def test_a_grid_sweep_keeps_nothing_per_finished_job(tmp_path: Path) -> None:
    result = run_probe_sweep(
        tmp_path,
        "hydra/sweeper=furcate",
        f"+i=range(0,{JOBS})",
        *callback(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert_nothing_kept_per_job(live_objects(tmp_path), JOBS)
    # what the launcher no longer holds, it wrote out: every job's row, with its metric
    with (tmp_path / "sweep" / "run_data.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["job_num"]) for row in rows] == list(range(JOBS))
    assert {row["status"] for row in rows} == {"FINISHED"}


def test_an_optuna_sweep_keeps_nothing_per_finished_trial(tmp_path: Path) -> None:
    trials = 30
    result = run_optuna_study(
        tmp_path,
        f"hydra.sweeper.n_trials={trials}",
        *callback(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert_nothing_kept_per_job(live_objects(tmp_path), trials)
