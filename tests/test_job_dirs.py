"""Values that end up in paths: a job dir, Hydra files or log outside the sweep dir are refused
before any job runs, with any sweeper; subdirs inside it work as before.

Where each path lands is judged in this process (``check_job_paths``); real CLI runs prove that
the furcate sweepers and Hydra's basic sweeper (through the furcate launcher) refuse a bad
value before the first job, and write nothing outside the sweep dir.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.launching.job_dirs import check_job_paths, job_output_dir
from tests.conftest import APPS, run_cli
from tests.store_helpers import all_runs

SWEEP = "/data/sweeps/s1"


def job_config(subdir: str, name: str = "train", **hydra: object) -> DictConfig:
    config = {
        "out": "../../z",
        "hydra": {
            "sweep": {"dir": SWEEP, "subdir": subdir},
            "job": {"name": name, "num": 3, "override_dirname": "+p=../../../z"},
            "output_subdir": ".hydra",
            **hydra,
        },
    }
    return OmegaConf.create(config)


def refusal(config: DictConfig, sweep_dir: str | Path) -> OptionError | None:
    """The error ``check_job_paths`` raises for job #3 of ``config``, None where it passes."""
    try:
        check_job_paths(config, sweep_dir, "job #3")
    except OptionError as error:
        return error
    return None


@pytest.mark.parametrize(
    "subdir",
    [
        "${hydra.job.num}",
        "a/b_${hydra.job.num}",
        "${hydra.sweep.dir}/abs_${hydra.job.num}",  # absolute, but inside the sweep dir
        "",  # the sweep dir itself, as Hydra allows
        "x/../y",
    ],
)
def test_job_dirs_inside_the_sweep_dir_pass(subdir: str) -> None:
    assert refusal(job_config(subdir), SWEEP) is None


@pytest.mark.parametrize(
    "config, key, text",
    [
        (
            job_config("../../y"),
            "Invalid hydra.sweep.subdir='../../y'",
            "puts the dir of job #3 at /data/y, outside the sweep dir /data/sweeps/s1",
        ),
        (
            job_config("/scratch/${hydra.job.num}"),
            "Invalid hydra.sweep.subdir='/scratch/${hydra.job.num}'",
            "resolves to '/scratch/3' and puts the dir of job #3 at /scratch/3",
        ),
        (
            job_config("${out}"),
            "Invalid hydra.sweep.subdir='${out}'",
            "resolves to '../../z' and puts the dir of job #3 at /data/z",
        ),
        (
            job_config("${hydra.job.override_dirname}"),
            "Invalid hydra.sweep.subdir='${hydra.job.override_dirname}'",
            "resolves to '+p=../../../z' and puts the dir of job #3 at /data/sweeps/z",
        ),
        (
            job_config("${hydra.job.num}", name="../../x"),
            "Invalid hydra.job.name='../../x'",
            "the log of job #3 would be /data/sweeps/x.log, outside the sweep dir /data/sweeps/s1",
        ),
        (
            job_config("${hydra.job.num}", name="a/b"),
            "Invalid hydra.job.name='a/b'",
            "the log of job #3 would be /data/sweeps/s1/3/a/b.log, in a folder nobody creates",
        ),
        (
            job_config("${hydra.job.num}", output_subdir="../../h"),
            "Invalid hydra.output_subdir='../../h'",
            "puts the Hydra files of job #3 at /data/sweeps/h",
        ),
        (
            # the job's own config moved its sweep dir away from the sweep's
            job_config("${hydra.job.num}", sweep={"dir": "/data/other", "subdir": "0"}),
            "Invalid hydra.sweep.dir='/data/other'",
            "puts the dir of job #3 at /data/other/0, outside the sweep dir /data/sweeps/s1",
        ),
    ],
)
def test_paths_outside_the_sweep_dir_are_named_with_key_value_place_and_fix(
    config: DictConfig, key: str, text: str
) -> None:
    with pytest.raises(OptionError) as raised:
        check_job_paths(config, SWEEP, "job #3")
    message = str(raised.value)
    assert message.startswith(key), message
    assert text in message
    assert "Fix:" in message


def test_a_symlink_in_the_sweep_dir_is_followed(tmp_path: Path) -> None:
    # made on purpose (job dirs on another disk): the path's text is judged, not its target
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    config = job_config("", sweep={"dir": str(sweep), "subdir": "link/${hydra.job.num}"})
    job_dir = Path(job_output_dir(config))
    assert job_dir == sweep / "link" / "3"
    assert not job_dir.resolve().is_relative_to(sweep.resolve())  # where it really lands: outside
    assert refusal(config, sweep) is None


# -- the real CLI ------------------------------------------------------------------------

GRID = ["hydra/sweeper=furcate"]
BASIC: list[str] = []  # the probe app's default: Hydra's basic sweeper


def probe_sweep(sweep: Path, *overrides: str) -> tuple[int, str]:
    """The probe app's sweep into ``sweep`` (two levels below the working directory): its exit
    status and stderr."""
    script = APPS / "probe_app.py"
    result = run_cli(script, "-m", f"hydra.sweep.dir={sweep}", *overrides, cwd=sweep.parents[1])
    return result.returncode, result.stderr


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


REFUSED = [
    pytest.param(
        GRID,
        ["hydra.job.name=../../x"],
        "Invalid hydra.job.name='../../x'",
        "x.log, outside",
        id="grid-job_name",
    ),
    pytest.param(
        BASIC,
        ["hydra.job.name=../../x"],
        "Invalid hydra.job.name='../../x'",
        "cannot contain '/'",
        id="basic-job_name",
    ),
    pytest.param(
        GRID,
        ["hydra.sweep.subdir=../../y"],
        "Invalid hydra.sweep.subdir='../../y'",
        "/y, outside",
        id="grid-subdir",
    ),
    pytest.param(
        BASIC,
        ["hydra.sweep.subdir=../../y"],
        "Invalid hydra.sweep.subdir='../../y'",
        "/y, outside",
        id="basic-subdir",
    ),
    # through an interpolation, and only for the second job: refused before the first runs
    pytest.param(
        BASIC,
        ["+p=ok,../../../z", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
        "Invalid hydra.sweep.subdir='${hydra.job.override_dirname}'",
        "resolves to '+p=../../../z' and puts the dir of job #1",
        id="basic-interpolated_subdir",
    ),
    pytest.param(
        GRID,
        ["+p=ok,../../../z", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
        "Invalid hydra.sweep.subdir='${hydra.job.override_dirname}'",
        "resolves to '+p=../../../z' and puts the dir of the config +p=../../../z",
        id="grid-interpolated_subdir",
    ),
]


@pytest.mark.parametrize("sweeper, overrides, key, text", REFUSED)
def test_a_path_outside_the_sweep_dir_is_refused_before_any_job_runs(
    tmp_path: Path, mlflow_store: str, sweeper: list[str], overrides: list[str], key: str, text: str
) -> None:
    sweep = tmp_path / "out" / "sweep"
    (tmp_path / "out").mkdir()
    before = files_under(tmp_path)
    code, stderr = probe_sweep(sweep, *sweeper, *overrides)
    assert code != 0
    assert key in stderr and text in stderr, stderr
    assert "Fix:" in stderr and "Traceback" not in stderr
    # nothing written outside the sweep dir (the store aside), and no job dir in it
    written = files_under(tmp_path) - before
    store = {p for p in written if p.name.startswith("mlflow.db")}
    assert {p for p in written - store if sweep not in p.parents} <= {sweep}
    assert {p.name for p in written if sweep in p.parents} <= {"multirun.yaml"}
    assert all_runs(mlflow_store) == []
    if "hydra.job.name" in key:
        from mlflow.tracking import MlflowClient

        assert MlflowClient(mlflow_store).get_experiment_by_name("../../x") is None


@pytest.mark.parametrize("sweeper", [GRID, BASIC], ids=["grid", "basic"])
def test_nested_subdirs_inside_the_sweep_dir_still_work(
    tmp_path: Path, mlflow_store: str, sweeper: list[str]
) -> None:
    sweep = tmp_path / "out" / "sweep"
    code, stderr = probe_sweep(sweep, *sweeper, "+i=0,1", "hydra.sweep.subdir=a/b_${hydra.job.num}")
    assert code == 0, stderr
    assert sorted(p.parent.name for p in sweep.glob("a/*/probe.json")) == ["b_0", "b_1"]


def test_job_dirs_through_a_symlink_in_the_sweep_dir_run(tmp_path: Path, mlflow_store: str) -> None:
    sweep = tmp_path / "out" / "sweep"
    sweep.mkdir(parents=True)
    (tmp_path / "disk").mkdir()
    os.symlink(tmp_path / "disk", sweep / "link")
    code, stderr = probe_sweep(sweep, *GRID, "+i=0,1", "hydra.sweep.subdir=link/${hydra.job.num}")
    assert code == 0, stderr
    assert sorted(p.parent.name for p in (tmp_path / "disk").glob("*/probe.json")) == ["0", "1"]
