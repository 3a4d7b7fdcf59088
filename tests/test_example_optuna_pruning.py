"""examples/optuna_pruning as its README runs it: an Optuna study whose bad trials get pruned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import FrozenTrial, TrialState

from furcate_hydra import env_vars
from furcate_hydra.store import Tags
from hydra_plugins.furcate_optuna_sweeper._study import Attrs
from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialTags
from tests.conftest import REPO, run_cli
from tests.store_helpers import artifact_names, job_runs, sweep_runs

EXAMPLE = REPO / "examples" / "optuna_pruning" / "optuna_pruning.py"
CONFIG: Any = OmegaConf.load(EXAMPLE.parent / "conf" / "config.yaml")
EPOCHS = int(CONFIG.epochs)
N_TRIALS = int(CONFIG.hydra.sweeper.n_trials)
STUDY = "optuna_pruning"  # the default study name: the task's


def reported_epochs(trial: FrozenTrial) -> list[int]:
    return sorted(trial.intermediate_values)


@pytest.mark.slow  # the example's 12 Lightning trials
def test_optuna_pruning_stops_the_bad_trials(tmp_path: Path, mlflow_store: str) -> None:
    # The job processes inherit MLFLOW_TRACKING_URI (the test's own store) from this process;
    # the study goes to the default storage, optuna.db in the working directory.
    from mlflow.tracking import MlflowClient

    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        EXAMPLE,
        "-m",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.launcher.gpus=[]",
        "hydra.launcher.max_workers=2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    # -- the study ----------------------------------------------------------------------
    assert (tmp_path / "optuna.db").is_file()
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    # named after the monitored metric, which the task returns: not "Objective 0"
    assert study.metric_names == [CONFIG.hydra.sweeper.monitor]
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert len(trials) == N_TRIALS, states
    assert set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}, states
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and completed, states
    for trial in completed:
        assert reported_epochs(trial) == list(range(EPOCHS)), trial
        assert trial.value == trial.intermediate_values[EPOCHS - 1]
    for trial in pruned:
        epochs = reported_epochs(trial)
        assert len(epochs) < EPOCHS, trial
        assert epochs == list(range(len(epochs))), trial
        # stopped at the epoch the pruner named, not earlier than its warmup allows
        assert trial.system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == epochs[-1], trial
        assert epochs[-1] >= int(CONFIG.hydra.sweeper.pruner.n_warmup_steps), trial
    # no trial is pruned before the pruner's startup trials completed
    startup = int(CONFIG.hydra.sweeper.pruner.n_startup_trials)
    assert len(completed) >= startup
    assert all(t.state == TrialState.COMPLETE for t in trials[:startup]), states

    # -- the sweep dir ------------------------------------------------------------------
    results: Any = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.name == "optuna"
    assert dict(results.best_params) == study.best_params
    assert set(results.best_params) == {"learning_rate", "hidden_size", "optimizer"}
    assert results.best_value == study.best_value
    assert study.best_trial.state == TrialState.COMPLETE

    # -- the MLflow runs: one per trial, told its trial ----------------------------------
    client = MlflowClient(mlflow_store)
    runs = {int(run.data.tags[TrialTags.NUMBER]): run for run in job_runs(mlflow_store)}
    assert sorted(runs) == [t.number for t in trials]
    for trial in trials:
        run = runs[trial.number]
        run_id = run.info.run_id
        tags = run.data.tags
        # a pruned job returns normally: its run finished, its trial says PRUNED
        assert run.info.status == "FINISHED"
        assert tags[TrialTags.STATE] == trial.state.name
        assert tags[TrialTags.STUDY] == STUDY
        assert trial.user_attrs[Attrs.MLFLOW_RUN] == run_id
        # what the trial was told, per epoch, is on its run too
        reported = client.get_metric_history(run_id, TrialTags.INTERMEDIATE)
        assert {m.step: m.value for m in reported} == trial.intermediate_values
        # what fit recorded: one val_loss and one history.json row per epoch that ran
        ran = len(reported_epochs(trial))
        assert len(client.get_metric_history(run_id, "val_loss")) == ran
        history = json.loads((Path(tags[Tags.OUTPUT_DIR]) / "history.json").read_text())
        assert [row["epoch"] for row in history] == list(range(ran))
        assert history[-1]["val_loss"] == trial.intermediate_values[ran - 1]
        if trial.state == TrialState.PRUNED:
            assert len(reported) < EPOCHS
            assert len(history) < EPOCHS
        else:
            assert len(history) == EPOCHS

    # -- the sweep's run: the study's results and plots ---------------------------------
    (sweep,) = sweep_runs(mlflow_store)
    artifacts = artifact_names(mlflow_store, sweep.info.run_id, "optuna")
    assert {"optuna/optimization_results.yaml", "optuna/optimization_history.png"} <= artifacts
    assert sweep.data.tags[TrialTags.BEST_TRIAL] == str(study.best_trial.number)
