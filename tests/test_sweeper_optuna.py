"""hydra/sweeper=furcate_optuna through the real CLI: async trials, studies that resume, MLflow.

Every test runs tests/apps/optuna_app.py (a sphere to minimise) in a subprocess, on 2 slots of
the furcate launcher, with a real sqlite Optuna storage and MLflow store in tmp_path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from furcate_hydra.store import RunStatus
from furcate_hydra.tuning.storage import rdb_storage
from tests.conftest import RunStudy
from tests.conftest import run_optuna_study as run_study
from tests.process_helpers import start_sweep
from tests.store_helpers import artifact_names, job_runs, sweep_runs
from tests.sweeper_helpers import ran_jobs

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

optuna.logging.set_verbosity(optuna.logging.WARNING)


def load_study(tmp_path: Path) -> optuna.Study:
    # through the sweeper's storage: it waits while a running sweep creates the schema
    storage = rdb_storage(f"sqlite:///{tmp_path}/optuna.db")
    return optuna.load_study(study_name="optuna_app", storage=storage)


def states(study: optuna.Study) -> dict[str, int]:
    counted: dict[str, int] = {}
    for trial in study.trials:
        counted[trial.state.name] = counted.get(trial.state.name, 0) + 1
    return counted


def test_a_fast_trials_slot_takes_the_next_trial_while_a_slow_one_runs(
    tmp_path: Path, mlflow_store: str
) -> None:
    result = run_study(tmp_path, "slow_job=0", "slow_s=3", "sleep=0.1")
    assert result.returncode == 0, result.stderr
    jobs = ran_jobs(tmp_path / "sweep")
    assert sorted(jobs) == list(range(6))
    slow = jobs[0]
    # the slow job's probe starts after its sleep: its slot was busy from (started_at - 3 s);
    # the first two trials are submitted together, so job 1 may start a moment before job 0
    slow_began = slow.started_at - 3 - 0.5
    inside = [j for j in jobs.values() if j.num and slow_began < j.started_at < slow.started_at]
    # all 5 other trials were asked, run and told on the other slot while job 0 slept
    assert len(inside) == 5, {j.num: (j.started_at - slow_began) for j in jobs.values()}
    assert {j.probe["slot"] for j in inside} == {next(iter(inside)).probe["slot"]}
    study = load_study(tmp_path)
    assert states(study) == {"COMPLETE": 6}
    # each trial is an MLflow run carrying its trial: number, state, value, and vice versa
    runs = {r.data.tags["optuna.trial_number"]: r for r in job_runs(mlflow_store)}
    assert sorted(runs, key=int) == [str(n) for n in range(6)]
    for trial in study.trials:
        run = runs[str(trial.number)]
        assert run.info.status == RunStatus.FINISHED.value
        assert run.data.tags["optuna.state"] == "COMPLETE"
        assert run.data.metrics["optuna.value"] == trial.value
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
        assert float(run.data.params["x"]) == trial.params["x"]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert results.best_value == study.best_value
    assert dict(results.best_params) == study.best_params
    (sweep_run,) = sweep_runs(mlflow_store)
    assert {
        "optuna/optimization_results.yaml",
        "optuna/optimization_history.png",
    } <= artifact_names(mlflow_store, sweep_run.info.run_id, "optuna")
    assert sweep_run.data.tags["optuna.best_trial"] == str(study.best_trial.number)


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (the batch loop, an anchor)
def test_the_batch_loop_waits_for_the_slowest_trial_of_each_batch(tmp_path: Path) -> None:
    # the anchor for the test above: hydra-optuna-sweeper's loop, batches of n_jobs
    result = run_study(
        tmp_path,
        "slow_job=0",
        "slow_s=2",
        "hydra.sweeper.asynchronous=false",
        "hydra.sweeper.n_jobs=2",
    )
    assert result.returncode == 0, result.stderr
    jobs = ran_jobs(tmp_path / "sweep")
    assert jobs[2].started_at > jobs[0].ended_at
    assert states(load_study(tmp_path)) == {"COMPLETE": 6}


@pytest.mark.slow  # several CLI sweeps in a row
def test_n_trials_is_the_studys_total_and_recorded_configs_are_told_without_running(
    tmp_path: Path, mlflow_store: str, run_study_in_process: RunStudy
) -> None:
    # x fixed, y one of 3: at most 3 distinct configs, however many trials are asked
    space = ["hydra/sweeper/sampler=random", "hydra.sweeper.params.x=0.5"]
    # the study's first 3 trials, in this process (raises where the CLI would fail); the CLI
    # runs below are the ones that read it
    run_study_in_process("hydra.sweeper.n_trials=3", *space)
    # the same study again: nothing is missing, nothing runs
    again = run_study(tmp_path, "hydra.sweeper.n_trials=3", *space, sweep="again")
    assert again.returncode == 0, again.stderr
    assert "3 of 3 trials already in the study, 0 to run" in again.stdout
    assert not ran_jobs(tmp_path / "again")
    assert len(load_study(tmp_path).trials) == 3

    more = run_study(tmp_path, "hydra.sweeper.n_trials=8", *space, sweep="more")
    assert more.returncode == 0, more.stderr
    assert "3 of 8 trials already in the study, 5 to run" in more.stdout
    study = load_study(tmp_path)
    assert states(study) == {"COMPLETE": 8}
    ran = len(ran_jobs(tmp_path / "sweep")) + len(ran_jobs(tmp_path / "more"))
    assert ran <= 3  # each config ran once: its later trials were told from its MLflow run
    runs = {r.info.run_id: r for r in job_runs(mlflow_store)}
    assert len(runs) == ran
    told = [t for t in study.trials if "furcate:from_mlflow_run" in t.system_attrs]
    assert len(told) == 8 - ran
    for trial in told:
        run = runs[trial.system_attrs["furcate:from_mlflow_run"]]
        assert float(run.data.params["y"]) == trial.params["y"]
        assert run.data.metrics["optuna.value"] == trial.value


@pytest.mark.slow  # several CLI sweeps in a row
def test_interrupted_trials_are_retried_and_the_study_reaches_n_trials(
    tmp_path: Path, mlflow_store: str
) -> None:
    process = start_study(tmp_path, "sleep=1.5")
    try:
        _wait_for(lambda: len(ran_jobs(tmp_path / "sweep")) >= 2, timeout=60)
        time.sleep(0.5)  # jobs 2 and 3 are running now
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()
    study = load_study(tmp_path)
    interrupted = [t for t in study.trials if "furcate:interrupted" in t.system_attrs]
    assert interrupted and all(t.state is TrialState.FAIL for t in interrupted)
    done = states(study).get("COMPLETE", 0)
    assert done < 6

    rerun = run_study(tmp_path, "sleep=1.5", sweep="rerun")  # the same configs
    assert rerun.returncode == 0, rerun.stderr
    study = load_study(tmp_path)
    assert states(study)["COMPLETE"] == 6
    # the interrupted trials ran again with their params, as new trials
    retried = {
        t.user_attrs["furcate_retry_of"]: t
        for t in study.trials
        if "furcate_retry_of" in t.user_attrs
    }
    assert sorted(retried) == sorted(t.number for t in interrupted)
    for trial in interrupted:
        assert retried[trial.number].params == trial.params
        assert retried[trial.number].state is TrialState.COMPLETE
    # and their MLflow runs were resumed, not left KILLED
    assert all(r.info.status == RunStatus.FINISHED.value for r in job_runs(mlflow_store))


def test_trials_left_running_by_a_killed_sweep_are_failed_and_retried(tmp_path: Path) -> None:
    process = start_study(tmp_path, "sleep=30", "hydra.sweeper.n_trials=3")
    try:
        _wait_for(lambda: _running_trials(tmp_path) == 2, timeout=60)
        os.kill(process.pid, signal.SIGKILL)  # no chance to tell anything
        process.wait(timeout=30)
    finally:
        process.kill()
    assert _running_trials(tmp_path) == 2

    rerun = run_study(tmp_path, "sleep=0", "hydra.sweeper.n_trials=3", sweep="rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.count("was left RUNNING") == 2
    study = load_study(tmp_path)
    assert states(study) == {"FAIL": 2, "COMPLETE": 3}
    assert all(
        "furcate:interrupted" in t.system_attrs for t in study.trials if t.state is TrialState.FAIL
    )


def test_excluded_samples_never_run_and_do_not_count(tmp_path: Path) -> None:
    result = run_study(tmp_path, "hydra.sweeper.exclude=[{y: 1}]", "hydra/sweeper/sampler=random")
    assert result.returncode == 0, result.stderr
    ran = ran_jobs(tmp_path / "sweep")
    assert len(ran) == 6
    assert all("y=1" not in job.overrides for job in ran.values())
    study = load_study(tmp_path)
    excluded = [t for t in study.trials if "furcate:excluded" in t.system_attrs]
    assert excluded, "seeded random sampling over 3 choices hits y=1 in 6 draws"
    assert "excludes nothing" not in result.stdout  # the rule can match: no warning
    assert all(t.params["y"] == 1 and t.state is TrialState.FAIL for t in excluded)
    assert states(study) == {"COMPLETE": 6, "FAIL": len(excluded)}


def test_rules_no_sample_can_match_are_named_before_the_first_trial(tmp_path: Path) -> None:
    result = run_study(
        tmp_path, "hydra.sweeper.exclude=[{y: 5}, {x: 0.5}]", "hydra.sweeper.n_trials=2"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "furcate_optuna: hydra.sweeper.exclude[0] {y=5} matches no config the search space can "
        "sample, so it excludes nothing: y is one of -1, 0, 1 in the configs the search space "
        "can sample"
    ) in result.stdout
    assert (
        "furcate_optuna: hydra.sweeper.exclude[1] {x=0.5} will almost never exclude anything: "
        "x is a number sampled from the interval [-2.0, 2.0], where one exact value is sampled "
        "with probability 0"
    ) in result.stdout
    assert len(ran_jobs(tmp_path / "sweep")) == 2


def test_an_all_excluded_space_stops_with_a_clear_error(tmp_path: Path) -> None:
    result = run_study(
        tmp_path, "hydra.sweeper.exclude=[{y: [-1, 0, 1]}]", "hydra.sweeper.max_resamples=5"
    )
    assert result.returncode != 0
    assert "Invalid hydra.sweeper.exclude=" in result.stderr
    assert "matched 5 sampled configs in a row" in result.stderr
    assert "Traceback" not in result.stderr
    assert not ran_jobs(tmp_path / "sweep")


def test_a_grid_sampler_runs_each_config_left_by_the_exclusions_once(tmp_path: Path) -> None:
    result = run_study(
        tmp_path,
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.params.x='range(0,2)'",  # 0, 1 and 2: the end too, as TPE may sample it
        "hydra.sweeper.exclude=[{x: 2, y: 0}]",
        "hydra.sweeper.n_trials=50",
    )
    assert result.returncode == 0, result.stderr
    assert "the grid has 8 configs to run" in result.stdout
    ran = {job.overrides for job in ran_jobs(tmp_path / "sweep").values()}
    expected = {(f"x={x}", f"y={y}") for x in (0, 1, 2) for y in (-1, 0, 1)} - {("x=2", "y=0")}
    assert ran == expected


@pytest.mark.slow  # CI runs it; the quick suite leaves it out (a whole study)
def test_several_directions_write_the_pareto_set(tmp_path: Path, mlflow_store: str) -> None:
    result = run_study(
        tmp_path,
        "returns=2",
        "hydra.sweeper.direction=[minimize,maximize]",
        "hydra.sweeper.metric_names=[loss,score]",
    )
    assert result.returncode == 0, result.stderr
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    study = load_study(tmp_path)
    assert study.metric_names == ["loss", "score"]  # optuna-dashboard's names of the axes
    assert len(results.solutions) == len(study.best_trials) >= 1
    run = job_runs(mlflow_store)[0]
    assert {"optuna.value.0", "optuna.value.1"} <= set(run.data.metrics)


def start_study(tmp_path: Path, *overrides: str) -> subprocess.Popen[bytes]:
    """The study's sweep in the background, in its own process group (a terminal's foreground
    job), so that a test can Ctrl-C or kill it."""
    return start_sweep("optuna_app.py", tmp_path, *overrides, stderr=subprocess.DEVNULL)


def _running_trials(tmp_path: Path) -> int:
    if not (tmp_path / "optuna.db").exists():
        return 0
    try:
        study = load_study(tmp_path)
    except KeyError:
        return 0
    return sum(1 for t in study.trials if t.state is TrialState.RUNNING)


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.parametrize(
    "sampler, through",
    [
        ("tpe", "cli"),
        # Hydra's multirun in this process: the same sweeper, launcher, jobs and stores
        ("random", "in_process"),
        ("grid", "in_process"),
        ("cmaes", "in_process"),
        ("nsgaii", "in_process"),
        ("qmc", "in_process"),
    ],
)
def test_every_sampler_runs_seeded(
    tmp_path: Path, run_study_in_process: RunStudy, sampler: str, through: str
) -> None:
    overrides = [
        f"hydra/sweeper/sampler={sampler}",
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.params.x='range(0,4)'",  # the grid sampler needs a list of values
    ]
    if through == "cli":
        result = run_study(tmp_path, *overrides)
        assert result.returncode == 0, result.stderr
    else:
        run_study_in_process(*overrides)  # raises what the CLI would report
    assert states(load_study(tmp_path)) == {"COMPLETE": 3}
    assert len(ran_jobs(tmp_path / "sweep")) == 3
