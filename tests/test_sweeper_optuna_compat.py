"""An existing hydra-optuna-sweeper config runs once its sweeper reads furcate_optuna."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from tests.conftest import APPS, run_cli

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

SPHERE = APPS / "sphere" / "sphere.py"


@pytest.mark.parametrize(
    "launcher",
    [
        [],  # as the example is: Hydra's basic launcher, batches of n_jobs=1
        ["hydra/launcher=furcate", "hydra.launcher.preload=[]", "hydra.launcher.gpus=[0,1]"],
    ],
    ids=["basic_launcher", "furcate_launcher"],
)
def test_the_sphere_example_runs_unchanged(tmp_path: Path, launcher: list[str]) -> None:
    result = run_cli(SPHERE, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *launcher, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # storage: null means the default sqlite:///optuna.db in the working directory
    study = optuna.load_study(study_name="sphere", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert len(study.trials) == 20
    assert all(t.state is TrialState.COMPLETE for t in study.trials)
    for trial in study.trials:
        assert trial.params["y"] in (-5, 0, 5)
        assert -5.5 <= trial.params["x"] <= 5.0  # range(-5.5, 5.5, step=0.5) lists up to 5.0
        assert trial.value == trial.params["x"] ** 2 + trial.params["y"] ** 2
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert results.name == "optuna"
    assert results.best_value == study.best_value == min(t.values[0] for t in study.trials)
    assert dict(results.best_params) == study.best_params


def test_the_examples_failure_switch_fails_the_sweep_at_max_failure_rate_0(tmp_path: Path) -> None:
    result = run_cli(
        SPHERE, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "error=true", cwd=tmp_path
    )
    assert result.returncode != 0
    assert "cfg.error is True" in result.stderr
    study = optuna.load_study(study_name="sphere", storage=f"sqlite:///{tmp_path}/optuna.db")
    # n_jobs=1: the first trial failed and nothing more was asked
    assert [t.state for t in study.trials] == [TrialState.FAIL]
