"""Bad launcher options stop the sweep before any job runs, with a message that says the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_probe_sweep

CASES = [
    # (overrides, env, key named, bad value shown)
    (["hydra.launcher.gpus=[0,-1]"], {}, "hydra.launcher.gpus", "-1"),
    (["hydra.launcher.gpus=[0,0]"], {}, "hydra.launcher.gpus", "[0, 0]"),
    (["hydra.launcher.gpus=zero"], {}, "hydra.launcher.gpus", "'zero'"),
    (["hydra.launcher.gpus=[0,1.5]"], {}, "hydra.launcher.gpus", "1.5"),
    (["hydra.launcher.jobs_per_gpu=0"], {}, "hydra.launcher.jobs_per_gpu", "0"),
    (["hydra.launcher.max_workers=-2"], {}, "hydra.launcher.max_workers", "-2"),
    (["hydra.launcher.cpus_per_job=0"], {}, "hydra.launcher.cpus_per_job", "0"),
    (["hydra.launcher.gpu_mem_per_job_gb=-1"], {}, "hydra.launcher.gpu_mem_per_job_gb", "-1"),
    (["hydra.launcher.max_retries=-1"], {}, "hydra.launcher.max_retries", "-1"),
    (["hydra.launcher.cpus_per_job=4096"], {}, "hydra.launcher.cpus_per_job", "4096"),
    (
        ["hydra.launcher.jobs_per_gpu=2", "hydra.launcher.gpu_mem_per_job_gb=4"],
        {},
        "hydra.launcher.jobs_per_gpu",
        "2",
    ),
    (["hydra.launcher.rerun=sometimes"], {}, "hydra.launcher.rerun", "'sometimes'"),
    (["hydra.launcher.mlflow.heartbeat_s=0"], {}, "hydra.launcher.mlflow.heartbeat_s", "0"),
    (
        ["hydra.launcher.mlflow.tracking_uri=http://127.0.0.1:9"],
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "'http://127.0.0.1:9'",
    ),
    (
        [],
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
        "MLFLOW_TRACKING_URI",
        "'http://127.0.0.1:9'",
    ),
    (
        ["hydra.launcher.mlflow.tracking_uri=sqlite:////no/such/folder/mlflow.db"],
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "/no/such/folder",
    ),
    (
        ["hydra.launcher.mlflow.tracking_uri=ftp://example.org/runs"],
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "'ftp://example.org/runs'",
    ),
    (
        ["hydra.launcher.allow_cpu=false"],
        {"CUDA_VISIBLE_DEVICES": ""},
        "hydra.launcher.allow_cpu",
        "False",
    ),
]


@pytest.mark.parametrize(("overrides", "env", "key", "value"), CASES)
def test_bad_option_is_a_clear_error_before_any_job(
    tmp_path: Path, overrides: list[str], env: dict[str, str], key: str, value: str
) -> None:
    sweep = tmp_path / "sweep"
    result = run_probe_sweep(tmp_path, "+i=0,1", *overrides, env=env)
    assert result.returncode != 0
    message = result.stderr
    assert f"Invalid {key}=" in message, message
    assert value in message, message
    assert "Fix:" in message, message
    assert not list(sweep.glob("*/probe.json")), "a job ran despite the bad option"


def test_malformed_cuda_visible_devices_is_named(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "+i=0,1", env={"CUDA_VISIBLE_DEVICES": "0,bogus"})
    assert result.returncode != 0
    assert "CUDA_VISIBLE_DEVICES" in result.stderr and "bogus" in result.stderr
    assert "Fix:" in result.stderr


def test_mistyped_count_is_rejected_by_the_schema(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "+i=0,1", "hydra.launcher.jobs_per_gpu=two")
    assert result.returncode != 0
    assert "jobs_per_gpu" in result.stderr and "two" in result.stderr
