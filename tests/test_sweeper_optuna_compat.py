"""hydra-optuna-sweeper's examples run once their sweeper reads furcate_optuna.

The apps and configs in ``tests/apps/sphere`` have the shape of the official examples
(``sphere.py``, ``multi-objective.py``, ``custom-search-space-objective.py``, and the test
config of the deprecated ``search_space``). hydra-optuna-sweeper needs optuna < 3, so it cannot
run beside this plugin: each test asserts what it guarantees for the example (the number of
trials, values inside the declared space with a range's end included, the best value the
study found, ``optimization_results.yaml``'s layout), one real CLI run per behaviour. Every
config says ``storage: null``: a new study per run, in the sweep dir.
"""

from __future__ import annotations

import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from tests.conftest import APPS, run_cli, run_sphere_config

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

SPHERE = APPS / "sphere"


def run_example(
    tmp_path: Path, script: str, *overrides: str, sweep: str = "sweep"
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        SPHERE / script, "-m", f"hydra.sweep.dir={tmp_path / sweep}", *overrides, cwd=tmp_path
    )


def sweep_study(tmp_path: Path, name: str, db: str = "optuna.db") -> optuna.Study:
    """The study ``storage: null`` made in the sweep dir; nothing in the working directory."""
    assert not (tmp_path / "optuna.db").exists()
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/sweep/{db}")


def on_steps(value: float, low: float, high: float, step: float) -> bool:
    """Is ``value`` one of ``low, low + step, ..., high`` (both ends included)?"""
    offset = Decimal(str(value)) - Decimal(str(low))
    return low <= value <= high and offset % Decimal(str(step)) == 0


def results(tmp_path: Path) -> Any:
    return OmegaConf.to_container(OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml"))


@pytest.mark.parametrize(
    "launcher",
    [
        # as the example is: Hydra's basic launcher, batches of n_jobs=1 (the anchor; CI runs it)
        pytest.param([], marks=pytest.mark.slow),
        ["hydra/launcher=furcate", "hydra.launcher.preload=[]", "hydra.launcher.gpus=[0,1]"],
    ],
    ids=["basic_launcher", "furcate_launcher"],
)
def test_the_sphere_example_runs_unchanged(tmp_path: Path, launcher: list[str]) -> None:
    result = run_example(tmp_path, "sphere.py", *launcher)
    assert result.returncode == 0, result.stderr
    study = sweep_study(tmp_path, "sphere")
    assert len(study.trials) == 20
    assert all(t.state is TrialState.COMPLETE for t in study.trials)
    for trial in study.trials:
        assert trial.params["y"] in (-5, 0, 5)
        assert on_steps(trial.params["x"], -5.5, 5.5, 0.5)  # range(-5.5, 5.5, step=0.5)
        assert trial.value == trial.params["x"] ** 2 + trial.params["y"] ** 2
    summary = results(tmp_path)
    assert set(summary) == {"name", "best_params", "best_value"}
    assert summary["name"] == "optuna"
    assert summary["best_value"] == study.best_value == min(t.values[0] for t in study.trials)
    assert summary["best_params"] == study.best_params


def test_the_examples_failure_switch_fails_the_sweep_at_max_failure_rate_0(tmp_path: Path) -> None:
    result = run_example(tmp_path, "sphere.py", "error=true")
    assert result.returncode != 0
    assert "cfg.error is True" in result.stderr
    study = sweep_study(tmp_path, "sphere")
    # n_jobs=1: the first trial failed and nothing more was asked
    assert [t.state for t in study.trials] == [TrialState.FAIL]


def test_storage_null_starts_a_new_study_every_run(tmp_path: Path) -> None:
    # hydra-optuna-sweeper's study is in memory: a rerun runs every trial again, even into the
    # same sweep dir, and reports its own results
    for _ in range(2):
        result = run_example(tmp_path, "sphere.py", "hydra.sweeper.n_trials=3")
        assert result.returncode == 0, result.stderr
        assert "0 of 3 trials already in the study, 3 to run" in result.stdout
    first, second = (sweep_study(tmp_path, "sphere", db) for db in ("optuna.db", "optuna-2.db"))
    assert len(first.trials) == len(second.trials) == 3
    assert results(tmp_path)["best_value"] == second.best_value


def test_the_multi_objective_example_writes_its_pareto_set(tmp_path: Path) -> None:
    result = run_example(tmp_path, "multi-objective.py", "hydra.sweeper.n_trials=8")
    assert result.returncode == 0, result.stderr
    study = sweep_study(tmp_path, "multi-objective")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 8
    for trial in study.trials:
        x, y = trial.params["x"], trial.params["y"]
        assert on_steps(x, 0, 5, 0.5) and on_steps(y, 0, 3, 0.5)
        assert trial.values == [4 * x**2 + 4 * y**2, (x - 5) ** 2 + (y - 5) ** 2]
    summary = results(tmp_path)
    assert set(summary) == {"name", "solutions"}
    solutions = summary["solutions"]
    assert sorted(map(str, solutions)) == sorted(
        str({"params": t.params, "values": t.values}) for t in study.best_trials
    )
    for one in solutions:  # a Pareto set: no solution dominates another
        for other in solutions:
            better = [a <= b for a, b in zip(one["values"], other["values"], strict=True)]
            assert not (all(better) and one["values"] != other["values"])


def test_the_custom_search_space_example_suggests_its_extra_params(tmp_path: Path) -> None:
    # custom_search_space: custom-search-space-objective.configure, a module next to the app
    result = run_example(tmp_path, "custom-search-space-objective.py", "hydra.sweeper.n_trials=6")
    assert result.returncode == 0, result.stderr
    study = sweep_study(tmp_path, "custom-search-space")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    for trial in study.trials:
        p = trial.params
        assert set(p) == {"x", "y", "z", "+w"}
        assert on_steps(p["x"], -5.5, 5.5, 0.5) and p["y"] in (-5, 0, 5)
        assert abs(p["z"] - p["x"]) <= 0.5 and 0 <= p["+w"] <= 1
        assert trial.value == pytest.approx(p["+w"] ** 2 + p["x"] ** 2 + p["y"] ** 2 + p["z"] ** 2)
    summary = results(tmp_path)
    assert summary["best_value"] == min(t.values[0] for t in study.trials)
    assert summary["best_params"] == study.best_params


def test_the_deprecated_search_space_runs_with_hydra_optuna_sweepers_warning(
    tmp_path: Path,
) -> None:
    # hydra-optuna-sweeper's test runs sphere.py with this config, as here
    result = run_sphere_config(tmp_path, "deprecated_search_space", "hydra.sweeper.n_trials=6")
    assert result.returncode == 0, result.stderr
    assert (
        "UserWarning: `hydra.sweeper.search_space` is deprecated and will be removed in the next "
        "major release. Please configure with `hydra.sweeper.params`: "
        "x: range(-5.5, 5.5, step=0.5)" in result.stderr
    )
    study = sweep_study(tmp_path, "sphere")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    for trial in study.trials:
        assert set(trial.params) == {"x"} and on_steps(trial.params["x"], -5.5, 5.5, 0.5)
        assert trial.value == trial.params["x"] ** 2 + 1  # y: 1
    assert results(tmp_path)["best_value"] == study.best_value
