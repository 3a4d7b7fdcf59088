"""Bad furcate_optuna input: a message naming the key, the value and the fix; nothing recorded
is lost. Each kind of check runs the real CLI; more bad option values are read in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from hydra.errors import CompactHydraException
from optuna.trial import TrialState

from furcate_hydra.hydra_api.options import OptionError
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper
from tests.conftest import RunStudy
from tests.conftest import run_optuna_study as run_study
from tests.option_helpers import parse_optuna_sweeper_options
from tests.store_helpers import job_runs
from tests.sweeper_helpers import ran_jobs


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["hydra/sweeper/sampler=annealing"],
            ["Could not find 'hydra/sweeper/sampler/annealing'", "tpe", "cmaes", "qmc"],
        ),
        (
            ["hydra/sweeper/pruner=patience"],
            ["Could not find 'hydra/sweeper/pruner/patience'", "median", "hyperband"],
        ),
        (
            ["hydra.sweeper.pruner.name=wilting"],
            ["Invalid hydra.sweeper.pruner=", "wilting", "hydra/sweeper/pruner=median"],
        ),
        (
            ["hydra.sweeper.params.x='interval(0,'"],
            ["Invalid hydra.sweeper.params.x='interval(0,'", "is not a valid search space"],
        ),
        (
            ["hydra/sweeper/sampler=grid"],  # x is an interval: no grid to walk
            ["Invalid hydra.sweeper.params.x=", "the grid sampler needs"],
        ),
        (
            ["hydra.sweeper.exclude=[{yy: 1}]"],
            ["Invalid hydra.sweeper.exclude[0]='yy'", "names a key that is in no config"],
        ),
        (
            ["hydra.sweeper.exclude=[{y: abc}]"],
            [
                "Invalid hydra.sweeper.exclude[0].y='abc': can never match",
                "y is a number in every config the search space can sample (-1, 0, 1)",
            ],
        ),
        (
            ["hydra.sweeper.n_jobs=0"],
            ["Invalid hydra.sweeper.n_jobs=0", "one trial per slot of the launcher"],
        ),
        (
            ["hydra.job.name=../../x"],
            ["Invalid hydra.job.name='../../x'", "outside the sweep dir"],
        ),
    ],
)
def test_bad_options_stop_before_any_trial(
    tmp_path: Path, mlflow_store: str, overrides: list[str], expected: list[str]
) -> None:
    result = run_study(tmp_path, *overrides)
    assert result.returncode != 0
    stderr = result.stderr
    for text in expected:
        assert text in stderr, stderr
    assert "Traceback" not in stderr
    assert not ran_jobs(tmp_path / "sweep")
    assert not job_runs(mlflow_store)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"pruner": {"name": "median", "n_warmup_steps": -1}}, "n_warmup_steps"),
        ({"direction": "sideways"}, "Invalid hydra.sweeper.direction='sideways'"),
        ({"direction": ["minimize", "up"]}, "minimize or maximize, or a list of them"),
        ({"n_trials": 0}, "Invalid hydra.sweeper.n_trials=0: must be a whole number, 1 or more"),
        ({"n_jobs": -2}, "Invalid hydra.sweeper.n_jobs=-2"),
        (
            {"n_jobs": 0},
            "Invalid hydra.sweeper.n_jobs=0: must be a whole number of trials in flight at once, "
            "1 or more. Fix: remove hydra.sweeper.n_jobs (or set it to null) for one trial per "
            "slot of the launcher, or set e.g. hydra.sweeper.n_jobs=4",
        ),
        ({"n_jobs": 1.5}, "Invalid hydra.sweeper.n_jobs=1.5: must be a whole number"),
        ({"n_jobs": "four"}, "Invalid hydra.sweeper.n_jobs='four': must be a whole number"),
        ({"n_jobs": True}, "Invalid hydra.sweeper.n_jobs=True: must be a whole number"),
        ({"max_failure_rate": 1.5}, "Invalid hydra.sweeper.max_failure_rate=1.5"),
        ({"monitor": ""}, "Invalid hydra.sweeper.monitor=''"),
        ({"custom_search_space": "no_such_module.configure"}, "takes (cfg, trial)"),
        ({"max_resamples": 0}, "Invalid hydra.sweeper.max_resamples=0"),
        ({"study_name": ""}, "Invalid hydra.sweeper.study_name=''"),
        ({"metric_names": ["a", "b"]}, "names 2 values, but the study has 1 direction(s)"),
        ({"metric_names": [1]}, "Invalid hydra.sweeper.metric_names=[1]: must be names"),
        (
            {"metric_names": ["loss", "loss"], "direction": ["minimize", "maximize"]},
            "names a value twice",
        ),
    ],
)
def test_bad_option_values_are_named_with_their_fix(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, **options})
    assert expected in str(raised.value)
    assert "Fix: " in str(raised.value)


def test_a_storage_that_is_not_a_url_is_named_with_its_fix() -> None:
    # the CLI cases above show such an error stopping the sweep before any trial
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage": "optuna.db"})
    message = str(raised.value)
    assert "Invalid hydra.sweeper.storage='optuna.db'" in message
    assert "sqlite:///optuna.db" in message
    # what Hydra prints as a compact message, not a stack trace
    assert isinstance(raised.value, CompactHydraException)


@pytest.mark.parametrize("value", ["10.0.0.5:http", "10.0.0.5:70000", ":13000", "a/b:1", 13000])
def test_a_bad_storage_proxy_address_is_named_with_its_fix(value: object) -> None:
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage_proxy": value})
    message = str(raised.value)
    assert f"Invalid hydra.sweeper.storage_proxy={value!r}" in message
    assert "HOST:PORT" in message and "Fix: set e.g. hydra.sweeper.storage_proxy=" in message


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("10.0.0.5:13000", ("10.0.0.5", 13000)),
        ("10.0.0.5", ("10.0.0.5", 0)),
        ("[::1]:9", ("::1", 9)),
    ],
)
def test_a_storage_proxy_address_is_host_and_port(value: str, parsed: tuple[str, int]) -> None:
    options = parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage_proxy": value})
    assert options.storage_proxy == parsed


@pytest.mark.parametrize(
    "options, key, fix",
    [
        (
            {"search_space": {"x": {"type": "float", "low": 0, "high": 1, "q": 0.1}}},
            "hydra.sweeper.search_space.x",
            "use only type, low, high, step, log, choices",
        ),
        (
            {"search_space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
            "hydra.sweeper.search_space.x",
            "write e.g. {type: float, low: 0.0, high: 1.0}",
        ),
        (
            {"search_space": {"x": {"type": "int", "low": 8, "high": 1}}},
            "hydra.sweeper.search_space.x",
            "write e.g. {type: int, low: 1, high: 100}",
        ),
        (
            {"search_space": {"x": {"type": "categorical", "choices": []}}},
            "hydra.sweeper.search_space.x",
            "write {type: categorical, choices: [a, b]}",
        ),
    ],
)
def test_a_bad_search_space_is_named_with_its_value_and_fix(
    options: dict[str, Any], key: str, fix: str
) -> None:
    with pytest.raises(OptionError) as raised:
        FurcateOptunaSweeper.parse_options({"pruner": {"name": "none"}, **options})
    error = raised.value
    assert error.key == key
    name = key.rpartition("search_space")[2].lstrip(".")
    value = options["search_space"][name] if name else options["search_space"]
    assert f"Invalid {key}={value!r}: " in str(error)
    assert f"Fix: {fix}" in str(error)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["returns=2"],
            "returned (1.0, -1.0) (2 values), but hydra.sweeper.direction is ['minimize'] "
            "(1 value). Fix: return a number (the value to minimize)",
        ),
        # the same check on other values: CI runs them, the quick suite one
        pytest.param(
            ["hydra.sweeper.direction=[minimize,maximize]"],
            "returned 1.0 (1 value), but hydra.sweeper.direction is ['minimize', 'maximize'] "
            "(2 values). Fix: return a tuple of 2 numbers, one per direction",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["returns=none"],
            "returned None, which is not a number. Fix: return a number",
            marks=pytest.mark.slow,
        ),
    ],
)
@pytest.mark.usefixtures("mlflow_store")
def test_a_task_returning_the_wrong_values_fails_its_trial_with_a_clear_error(
    tmp_path: Path, overrides: list[str], expected: str
) -> None:
    # x=0 y=0 gives 1.0; n_jobs=1 so the first failure is the only trial
    fixed = ["hydra.sweeper.params.x=0", "hydra.sweeper.params.y=0", "hydra.sweeper.n_jobs=1"]
    result = run_study(tmp_path, *fixed, *overrides)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    study = optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    (trial,) = study.trials
    assert trial.state is TrialState.FAIL
    assert expected.split(" (")[0] in trial.user_attrs["furcate_error"]


def test_a_study_keeps_its_directions(tmp_path: Path, run_study_in_process: RunStudy) -> None:
    # the study, in this process (raises where the CLI would fail); the CLI run below reopens it
    run_study_in_process("hydra.sweeper.n_trials=2")
    again = run_study(tmp_path, "hydra.sweeper.direction=maximize", sweep="again")
    assert again.returncode != 0
    assert "Invalid hydra.sweeper.direction=['maximize']" in again.stderr
    assert "hydra.sweeper.study_name=<new name>" in again.stderr
    study = optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2  # nothing lost
