"""Bad ``hydra.launcher.slurm`` input: refused before anything is submitted or runs, naming the
key, the bad value and the fix. In this process (no Slurm needed), plus one real CLI run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.slurm import SlurmJob, SlurmOptions, allocation_cpus
from furcate_hydra.slurm.session import SlurmSession
from furcate_hydra.slurm.shared_disk import disk_of
from tests.conftest import run_probe_sweep
from tests.option_helpers import check_launcher_options

# keys typed Any in the config (OmegaConf would turn "yes" into true for a bool, and refuse
# a str where a list goes, with its own message): furcate's check is what the user meets
BAD: list[tuple[dict[str, Any], str, object]] = [
    ({"allocations": 0}, "allocations", 0),
    ({"allocations": 1.5}, "allocations", 1.5),
    ({"gpus_per_allocation": -1}, "gpus_per_allocation", -1),
    ({"cpus_per_allocation": 0}, "cpus_per_allocation", 0),
    ({"time": "two hours"}, "time", "two hours"),
    ({"signal_s": -5}, "signal_s", -5),
    ({"poll_s": 0}, "poll_s", 0.0),
    ({"partition": ""}, "partition", ""),
]
# typed keys, as a caller that does not go through OmegaConf may pass them
BAD_TYPED: list[tuple[dict[str, Any], str, object]] = [
    ({"requeue": "yes"}, "requeue", "yes"),
    ({"wait": "sometimes"}, "wait", "sometimes"),
    ({"sbatch_args": "--qos=high"}, "sbatch_args", "--qos=high"),
]


@pytest.mark.parametrize(("options", "key", "value"), BAD)
def test_a_bad_slurm_option_is_refused_naming_key_value_and_fix(
    options: dict[str, Any], key: str, value: object
) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        check_launcher_options({"slurm": options})
    message = str(raised.value)
    assert f"hydra.launcher.slurm.{key}={value!r}" in message, message
    assert "Fix:" in message, message


@pytest.mark.parametrize(("options", "key", "value"), BAD_TYPED)
def test_a_bad_typed_slurm_option_is_refused(
    options: dict[str, Any], key: str, value: object
) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        SlurmOptions.parse(options)
    message = str(raised.value)
    assert f"hydra.launcher.slurm.{key}={value!r}" in message and "Fix:" in message, message


@pytest.mark.parametrize("time", ["30", "04:00:00", "1-12", "2-00:30:00", 90])
def test_slurm_time_limits_in_slurms_forms_are_taken(time: object) -> None:
    assert SlurmOptions.parse({"time": time}).time == str(time)


def test_requeue_true_outside_a_slurm_job_is_refused() -> None:
    with pytest.raises(FurcateConfigError) as raised:
        SlurmSession.detect(SlurmOptions(requeue=True), environ={})
    message = str(raised.value)
    assert "hydra.launcher.slurm.requeue=True" in message and "SLURM_JOB_ID" in message
    assert SlurmSession.detect(SlurmOptions(), environ={}) is None  # unset: not in Slurm, fine


def test_requeue_true_outside_slurm_stops_the_cli_before_any_job(
    tmp_path: Path, mlflow_store: str
) -> None:
    done = run_probe_sweep(tmp_path, "+i=1,2", "hydra.launcher.slurm.requeue=true")
    assert done.returncode != 0
    assert "hydra.launcher.slurm.requeue" in done.stderr and "SLURM_JOB_ID" in done.stderr
    assert not list((tmp_path / "sweep").glob("*/probe.json"))


def test_the_slurm_job_is_read_from_its_environment() -> None:
    job = SlurmJob.from_environ(
        {
            "SLURM_JOB_ID": "41",
            "SLURM_ARRAY_JOB_ID": "40",
            "SLURM_ARRAY_TASK_ID": "1",
            "SLURMD_NODENAME": "gpu7",
            "SLURM_CPUS_ON_NODE": "4",
            "SLURM_RESTART_COUNT": "2",
        }
    )
    assert job is not None
    assert job.label == "40_1" and job.node == "gpu7" and job.restart_count == 2
    assert job.describe() == "Slurm job 40_1 on gpu7, requeued 2x"
    # a node that does not bind (task/none): the first SLURM_CPUS_ON_NODE cores
    assert allocation_cpus(job, [0, 1, 2, 3, 4, 5, 6, 7]) == [0, 1, 2, 3]
    # bound to its allocation: the affinity as it is
    assert allocation_cpus(job, [2, 5]) == [2, 5]


def test_the_disk_of_a_path_is_its_longest_mount() -> None:
    mounts = "/dev/sda1 / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
    assert disk_of(Path("/home/me/mlflow.db"), mounts).networked
    assert disk_of(Path("/home/me/mlflow.db"), mounts).mount == "/home"
    assert not disk_of(Path("/tmp/mlflow.db"), mounts).networked
    assert disk_of(Path("/var/x.db"), mounts).fs_type == "ext4"
