"""Streaming: a slot takes its next job when its own job ends, not when the batch ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_probe_sweep
from tests.sweeper_helpers import ran_jobs

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

# One slow job then three fast ones on two slots. Hydra's batches of two would hold jobs 2
# and 3 back until the slow job 0 ends. The slow job is long enough that a loaded machine
# (seconds to start a job) still starts jobs 2 and 3 while it runs.
JOBS = ["sleep=5,0.3,0.31,0.32", "hydra.launcher.gpus=[0,1]", "hydra.sweeper.watch=false"]


def test_a_freed_slot_restarts_before_the_slowest_job_of_its_batch_ends(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "hydra/sweeper=furcate", *JOBS)
    assert result.returncode == 0, result.stderr
    slow, fast, third, fourth = ran_jobs(tmp_path / "sweep").values()
    assert third.started_at < slow.ended_at - 1.0
    assert fourth.started_at < slow.ended_at - 0.5
    # the slot that ran the fast job ran the next ones, one after the other
    assert third.probe["slot"] == fast.probe["slot"] == fourth.probe["slot"]
    assert slow.probe["slot"] != fast.probe["slot"]
    assert fast.ended_at <= third.started_at and third.ended_at <= fourth.started_at


def test_hydra_batches_hold_the_freed_slot_until_the_batch_ends(tmp_path: Path) -> None:
    """The anchor: the same jobs through Hydra's basic sweeper in batches of two."""
    result = run_probe_sweep(
        tmp_path, "hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2", *JOBS[:2]
    )
    assert result.returncode == 0, result.stderr
    slow, _, third, _ = ran_jobs(tmp_path / "sweep").values()
    assert third.started_at >= slow.ended_at
