"""hydra/sweeper=furcate through the real CLI: Hydra's grid syntax, exclusions, failures."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobStatus
from hydra.errors import CompactHydraException

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.store import RunStatus
from tests.conftest import LaunchJobs, run_probe_sweep
from tests.option_helpers import parse_grid_sweeper_options
from tests.store_helpers import job_runs
from tests.sweeper_helpers import ran_jobs, ran_overrides

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

GRID = ["hydra/sweeper=furcate", "hydra.launcher.gpus=[0,1]"]


def test_exclusions_match_lists_dotted_keys_and_group_choices(tmp_path: Path) -> None:
    # model/small.yaml has width 8 depth 1, model/big.yaml width 64 depth 3: the rules below
    # read those from the composed config (group defaults), not from the command line.
    rules = (
        "hydra.sweeper.exclude=["
        "{model: big, sleep: 0},"  # a group's choice
        "{model: {width: 8}, sleep: [0.01, 0.02]},"  # nested keys, a list meaning any of
        "{model.depth: 3, sleep: 0.02}]"  # a dotted key
    )
    result = run_probe_sweep(tmp_path, *GRID, "+model=small,big", "sleep=0,0.01,0.02", rules)
    assert result.returncode == 0, result.stderr
    assert ran_overrides(tmp_path / "sweep") == [
        ("+model=small", "sleep=0"),
        ("+model=big", "sleep=0.01"),
    ]
    assert (
        "2 of 6 configs in the grid, 4 excluded by hydra.sweeper.exclude "
        "({model='big', sleep=0}: 1, {model.width=8, sleep in [0.01, 0.02]}: 2, "
        "{model.depth=3, sleep=0.02}: 1)"
    ) in result.stdout
    # job numbers are dense: excluded configs take none
    assert list(ran_jobs(tmp_path / "sweep")) == [0, 1]


def test_rules_that_match_no_config_are_named_with_the_grids_values(tmp_path: Path) -> None:
    rules = "hydra.sweeper.exclude=[{model: small}, {sleep: 0.5}, {model: big, model.width: 8}]"
    result = run_probe_sweep(tmp_path, *GRID, "+model=small,big", "sleep=0,0.01", rules)
    assert result.returncode == 0, result.stderr
    assert ran_overrides(tmp_path / "sweep") == [
        ("+model=big", "sleep=0"),
        ("+model=big", "sleep=0.01"),
    ]
    warnings = [line for line in result.stdout.splitlines() if "excludes nothing" in line]
    assert len(warnings) == 2, result.stdout
    assert warnings[0].endswith(
        "furcate: hydra.sweeper.exclude[1] {sleep=0.5} matches no config of the grid, so it "
        "excludes nothing: sleep is one of 0, 0.01 in the configs of the grid"
    )
    assert warnings[1].endswith(
        "furcate: hydra.sweeper.exclude[2] {model='big', model.width=8} matches no config of "
        "the grid, so it excludes nothing: each of its values occurs, but no config of the "
        "grid has them together (model: 'small', 'big'; model.width: 8, 64)"
    )


def test_grid_syntax_and_order_are_hydras(tmp_path: Path) -> None:
    result = run_probe_sweep(
        tmp_path,
        *GRID,
        "hydra.sweeper.watch=false",
        "+hydra.sweeper.params.sleep='choice(0,0.01)'",  # params come first in the grid
        "+model=glob(*)",  # a config-group sweep over every option
        "+i=range(0,2)",
    )
    assert result.returncode == 0, result.stderr
    expected = list(
        itertools.product(
            ["sleep=0", "sleep=0.01"], ["+model=big", "+model=small"], ["+i=0", "+i=1"]
        )
    )
    assert ran_overrides(tmp_path / "sweep") == expected
    assert "8 of 8 configs in the grid" in result.stdout


def test_an_override_interpolating_a_job_field_is_left_to_the_job(tmp_path: Path) -> None:
    # The live-edit set-up (watch is on) reads the command line to compose edits later; the
    # job number only exists per job, so reading it must not resolve it.
    result = run_probe_sweep(
        tmp_path, "hydra/sweeper=furcate", "hydra.sweep.subdir=${hydra.job.num}", "+i=0,1"
    )
    assert result.returncode == 0, result.stderr
    assert "furcate: watching" in result.stdout
    jobs = ran_jobs(tmp_path / "sweep")
    assert list(jobs) == [0, 1]
    for num in jobs:
        assert (tmp_path / "sweep" / str(num) / "probe.json").is_file()


def test_a_failing_job_does_not_stop_the_sweep(tmp_path: Path, mlflow_store: str) -> None:
    result = run_probe_sweep(tmp_path, *GRID, "mode=raise,ok", "+i=0,1,2")
    assert result.returncode != 0
    # every config ran, the failing ones included (the probe records before it raises)
    assert len(ran_jobs(tmp_path / "sweep")) == 6
    assert "furcate: 3 of 6 jobs failed: #0 (mode=raise +i=0)" in result.stdout
    assert "the task raised on purpose" in result.stderr
    statuses = sorted(r.info.status for r in job_runs(mlflow_store))
    assert statuses == [RunStatus.FAILED.value] * 3 + [RunStatus.FINISHED.value] * 3


BAD_OPTIONS = [
    # found while planning the grid (the command line, the params, the composed configs)
    (
        ["+hydra.sweeper.params.sleep='interval(0,1)'"],
        "Invalid hydra.sweeper.params.sleep='interval(0,1)': is an interval",
    ),
    (["sleep=interval(0,1)"], "Invalid sleep='interval(0,1)': is an interval"),
    (["+hydra.sweeper.params.sleep='1,2,('"], "Invalid hydra.sweeper.params.sleep='1,2,('"),
    (["hydra.sweeper.exclude=[{sleeep: 0}]"], "Invalid hydra.sweeper.exclude[0]='sleeep'"),
    # a value no config's sleep (a number) can ever equal: the rule could exclude nothing
    (
        ["hydra.sweeper.exclude=[{sleep: 0}, {sleep: [abc, true]}]"],
        "Invalid hydra.sweeper.exclude[1].sleep=['abc', True]: can never match, so the rule "
        "excludes nothing: sleep is a number in every config of the grid (0, 0.01), which "
        "'abc' (a string) or True (a boolean) can never equal",
    ),
    # found by the sweeper's setup, reading its options (more values below, in this process)
    (["hydra.sweeper.max_batch_size=0"], "Invalid hydra.sweeper.max_batch_size=0"),
]


@pytest.mark.parametrize(
    "overrides, message", BAD_OPTIONS, ids=[o[0][0].split("=")[0] for o in BAD_OPTIONS]
)
def test_bad_sweeper_options_stop_before_anything_runs(
    tmp_path: Path, mlflow_store: str, overrides: list[str], message: str
) -> None:
    result = run_probe_sweep(tmp_path, *GRID, "sleep=0,0.01", *overrides)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Fix:" in result.stderr
    assert "Traceback" not in result.stderr  # a compact message, not a stack trace
    assert ran_jobs(tmp_path / "sweep") == {}
    assert not [path for path in (tmp_path / "sweep").glob("*") if path.is_dir()]  # no job dir
    assert job_runs(mlflow_store) == []


BAD_OPTION_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"exclude": [{}]}, "Invalid hydra.sweeper.exclude[0]={}"),
    ({"exclude": [{"sleep": []}]}, "Invalid hydra.sweeper.exclude[0].sleep=[]"),
    ({"max_batch_size": 0}, "Invalid hydra.sweeper.max_batch_size=0"),
    ({"watch_interval_s": 0.0}, "Invalid hydra.sweeper.watch_interval_s=0.0"),
]


@pytest.mark.parametrize(
    "options, message", BAD_OPTION_VALUES, ids=[next(iter(o[0])) for o in BAD_OPTION_VALUES]
)
def test_bad_sweeper_option_values_are_named_with_their_fix(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(OptionError) as raised:
        parse_grid_sweeper_options({"params": {"sleep": "0,0.01"}, **options})
    assert message in str(raised.value)
    assert "Fix:" in str(raised.value)
    # what Hydra prints as a compact message, not a stack trace
    assert isinstance(raised.value, CompactHydraException)


def test_a_bad_sweep_leaves_what_was_recorded_intact(
    tmp_path: Path, mlflow_store: str, launch_jobs: LaunchJobs
) -> None:
    # what a sweep of sleep=0,0.01 records, run by the launcher in this process
    recorded = launch_jobs(
        [["sleep=0"], ["sleep=0.01"]],
        [f"hydra.sweep.dir={tmp_path / 'first'}", "hydra.launcher.gpus=[0,1]"],
    )
    launch_jobs.last.close()  # the sweep's run ends, as when the CLI's process exits
    assert [r.status for r in recorded] == [JobStatus.COMPLETED] * 2
    before = [(r.info.run_id, r.info.status, r.info.end_time) for r in job_runs(mlflow_store)]
    bad = run_probe_sweep(tmp_path, *GRID, "sleep=0,0.01", "hydra.sweeper.exclude=[{sleeep: 0}]")
    assert bad.returncode != 0
    after = [(r.info.run_id, r.info.status, r.info.end_time) for r in job_runs(mlflow_store)]
    assert after == before and len(before) == 2
