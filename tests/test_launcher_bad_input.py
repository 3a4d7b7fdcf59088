"""Bad launcher options stop the sweep before any job runs, with a message that says the fix.

Every bad value is checked in this process (``check_launcher_options``); one real CLI run per
kind of check (a slot option, the tracking store named by the environment, Hydra's schema)
proves that the error reaches the user through Hydra and that no job starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from tests.conftest import run_probe_sweep
from tests.option_helpers import check_launcher_options

CASES: list[tuple[dict[str, Any], dict[str, str], str, str]] = [
    # (hydra.launcher options, env, key named, bad value shown)
    ({"gpus": [0, -1]}, {}, "hydra.launcher.gpus", "-1"),
    ({"gpus": [0, 0]}, {}, "hydra.launcher.gpus", "[0, 0]"),
    ({"gpus": "zero"}, {}, "hydra.launcher.gpus", "'zero'"),
    ({"gpus": [0, 1.5]}, {}, "hydra.launcher.gpus", "1.5"),
    ({"jobs_per_gpu": 0}, {}, "hydra.launcher.jobs_per_gpu", "0"),
    ({"jobs_per_gpu": "many"}, {}, "hydra.launcher.jobs_per_gpu", "'many'"),
    ({"jobs_per_gpu": "auto", "backend": "ray"}, {}, "hydra.launcher.jobs_per_gpu", "'auto'"),
    ({"auto_min_gain": -0.1}, {}, "hydra.launcher.auto_min_gain", "-0.1"),
    ({"auto_min_gain": "much"}, {}, "hydra.launcher.auto_min_gain", "'much'"),
    ({"max_jobs_per_gpu": 0}, {}, "hydra.launcher.max_jobs_per_gpu", "0"),
    ({"gpu_mem_margin_gb": -1}, {}, "hydra.launcher.gpu_mem_margin_gb", "-1"),
    ({"mps": "sometimes"}, {}, "hydra.launcher.mps", "'sometimes'"),
    ({"mps": "on", "backend": "ray"}, {}, "hydra.launcher.mps", "'on'"),
    ({"gpu_mem_margin_gb": "some"}, {}, "hydra.launcher.gpu_mem_margin_gb", "'some'"),
    ({"max_workers": -2}, {}, "hydra.launcher.max_workers", "-2"),
    ({"cpus_per_job": 0}, {}, "hydra.launcher.cpus_per_job", "0"),
    ({"gpu_mem_per_job_gb": -1}, {}, "hydra.launcher.gpu_mem_per_job_gb", "-1"),
    ({"max_retries": -1}, {}, "hydra.launcher.max_retries", "-1"),
    ({"max_preemptions": -1}, {}, "hydra.launcher.max_preemptions", "-1"),
    ({"max_preemptions": "often"}, {}, "hydra.launcher.max_preemptions", "'often'"),
    ({"max_preemptions": 1.5}, {}, "hydra.launcher.max_preemptions", "1.5"),
    ({"checkpoint_every_n_steps": 0}, {}, "hydra.launcher.checkpoint_every_n_steps", "0"),
    ({"checkpoint_every_n_steps": -5}, {}, "hydra.launcher.checkpoint_every_n_steps", "-5"),
    (
        {"checkpoint_every_n_steps": "many"},
        {},
        "hydra.launcher.checkpoint_every_n_steps",
        "'many'",
    ),
    ({"checkpoint_every_s": 0}, {}, "hydra.launcher.checkpoint_every_s", "0"),
    ({"checkpoint_every_s": -60}, {}, "hydra.launcher.checkpoint_every_s", "-60"),
    ({"checkpoint_every_s": "hourly"}, {}, "hydra.launcher.checkpoint_every_s", "'hourly'"),
    ({"cpus_per_job": 4096}, {}, "hydra.launcher.cpus_per_job", "4096"),
    (
        {"jobs_per_gpu": 2, "gpu_mem_per_job_gb": 4},
        {},
        "hydra.launcher.jobs_per_gpu",
        "2",
    ),
    ({"gpus_per_job": 0}, {}, "hydra.launcher.gpus_per_job", "0"),
    ({"fuse": "maybe"}, {}, "hydra.launcher.fuse", "'maybe'"),
    ({"fuse": True}, {}, "hydra.launcher.fuse", "True"),  # YAML's bare on
    ({"fuse": "auto", "fuse_max": 0}, {}, "hydra.launcher.fuse_max", "0"),
    ({"fuse": "auto", "fuse_max": 2.5}, {}, "hydra.launcher.fuse_max", "2.5"),
    ({"fuse": "auto", "fuse_max": "wide"}, {}, "hydra.launcher.fuse_max", "'wide'"),
    ({"fuse": "auto", "backend": "ray"}, {}, "hydra.launcher.fuse", "'auto'"),
    ({"fuse": "auto", "jobs_per_gpu": "auto"}, {}, "hydra.launcher.fuse", "'auto'"),
    ({"gpus_per_job": -1}, {}, "hydra.launcher.gpus_per_job", "-1"),
    ({"gpus_per_job": "two"}, {}, "hydra.launcher.gpus_per_job", "'two'"),
    ({"gpus_per_job": True}, {}, "hydra.launcher.gpus_per_job", "True"),
    ({"gpus_per_job": 1.5}, {}, "hydra.launcher.gpus_per_job", "1.5"),
    ({"gpus_per_job": 2, "jobs_per_gpu": 2}, {}, "hydra.launcher.gpus_per_job", "2"),
    ({"gpus_per_job": 2, "jobs_per_gpu": "auto"}, {}, "hydra.launcher.gpus_per_job", "2"),
    ({"gpus_per_job": 2, "gpu_mem_per_job_gb": 8}, {}, "hydra.launcher.gpus_per_job", "2"),
    ({"gpus_per_job": 2, "mps": "on"}, {}, "hydra.launcher.mps", "'on'"),
    ({"gpus_per_job": 3, "gpus": [0, 1]}, {}, "hydra.launcher.gpus_per_job", "3"),
    ({"rerun": "sometimes"}, {}, "hydra.launcher.rerun", "'sometimes'"),
    ({"lightning": "maybe"}, {}, "hydra.launcher.lightning", "'maybe'"),
    ({"backend": "kubernetes"}, {}, "hydra.launcher.backend", "'kubernetes'"),
    ({"ray": {"address": "head"}}, {}, "hydra.launcher.ray.address", "'head'"),
    ({"ray": {"runtime_env": [1]}}, {}, "hydra.launcher.ray.runtime_env", "[1]"),
    ({"ray": {"gpu_memory_gb": 0}}, {}, "hydra.launcher.ray.gpu_memory_gb", "0"),
    ({"ray": {"start_timeout_s": -1}}, {}, "hydra.launcher.ray.start_timeout_s", "-1"),
    ({"mlflow": {"heartbeat_s": 0}}, {}, "hydra.launcher.mlflow.heartbeat_s", "0"),
    (
        {"mlflow": {"tracking_uri": "http://127.0.0.1:9"}},
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "'http://127.0.0.1:9'",
    ),
    (
        {},
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
        "MLFLOW_TRACKING_URI",
        "'http://127.0.0.1:9'",
    ),
    (
        {"mlflow": {"tracking_uri": "sqlite:////no/such/folder/mlflow.db"}},
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "/no/such/folder",
    ),
    (
        {"mlflow": {"tracking_uri": "ftp://example.org/runs"}},
        {},
        "hydra.launcher.mlflow.tracking_uri",
        "'ftp://example.org/runs'",
    ),
    (
        {"allow_cpu": False},
        {"CUDA_VISIBLE_DEVICES": ""},
        "hydra.launcher.allow_cpu",
        "False",
    ),
]


@pytest.mark.parametrize(("options", "env", "key", "value"), CASES)
def test_bad_option_is_named_with_its_value_and_fix(
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, Any],
    env: dict[str, str],
    key: str,
    value: str,
) -> None:
    for name, setting in env.items():
        monkeypatch.setenv(name, setting)
    with pytest.raises(FurcateConfigError) as raised:
        check_launcher_options(options)
    message = str(raised.value)
    assert f"Invalid {key}=" in message, message
    assert value in message, message
    assert "Fix:" in message, message


CLI_CASES = [
    # (overrides, env, key named, bad value shown)
    (["hydra.launcher.gpus=[0,-1]"], {}, "hydra.launcher.gpus", "-1"),  # the slot plan
    # a number option given a word: furcate's message, not Hydra's schema error
    (["hydra.launcher.checkpoint_every_s=soon"], {}, "hydra.launcher.checkpoint_every_s", "'soon'"),
    (["hydra.launcher.gpus_per_job=two"], {}, "hydra.launcher.gpus_per_job", "'two'"),
    (["hydra.launcher.fuse=maybe"], {}, "hydra.launcher.fuse", "'maybe'"),
    (["hydra.launcher.fuse=auto", "hydra.launcher.fuse_max=0"], {}, "hydra.launcher.fuse_max", "0"),
    (
        [],  # the tracking store, named by the environment the jobs would inherit
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
        "MLFLOW_TRACKING_URI",
        "'http://127.0.0.1:9'",
    ),
]


@pytest.mark.usefixtures("mlflow_store")
@pytest.mark.parametrize(("overrides", "env", "key", "value"), CLI_CASES)
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


def test_malformed_cuda_visible_devices_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,bogus")
    with pytest.raises(FurcateConfigError) as raised:
        check_launcher_options({})
    message = str(raised.value)
    assert "CUDA_VISIBLE_DEVICES" in message and "bogus" in message
    assert "Fix:" in message


@pytest.mark.usefixtures("mlflow_store")
def test_mistyped_count_is_refused_through_the_cli(tmp_path: Path) -> None:
    result = run_probe_sweep(tmp_path, "+i=0,1", "hydra.launcher.jobs_per_gpu=two")
    assert result.returncode != 0
    assert "jobs_per_gpu" in result.stderr and "two" in result.stderr


@pytest.mark.parametrize("lightning", ["off", "auto"])
def test_fuse_with_lightning_off_says_an_apps_own_trainer_trains_alone(
    launch_jobs: Any, caplog: pytest.LogCaptureFixture, lightning: str
) -> None:
    # with lightning=off an app's own Trainer.fit is never reached, so its jobs cannot join a
    # group and no job could say why: the launch says it once, with the fix
    returns = launch_jobs(
        [["+i=0"], ["+i=1"]],
        [
            "hydra.launcher.gpus=[0]",
            "hydra.launcher.fuse=auto",
            f"hydra.launcher.lightning={lightning}",
        ],
    )
    from hydra.core.utils import JobStatus

    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 2  # a warning, not an error
    warned = "a Trainer the task builds itself trains alone" in caplog.text
    assert warned == (lightning == "off"), caplog.text
    if warned:
        assert "set hydra.launcher.lightning=auto" in caplog.text
