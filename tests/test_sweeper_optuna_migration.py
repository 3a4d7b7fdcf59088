"""Coming from hydra-optuna-sweeper: its configs as they are written, and its behaviour where its
own tests show it.

Through the real CLI: tests/apps/optuna_app.py (a sphere to minimise) on 2 slots of the furcate
launcher, and hydra-optuna-sweeper's example app (tests/apps/sphere), with a real sqlite Optuna
storage and MLflow store in tmp_path.
"""

from __future__ import annotations

import logging
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.furcate_optuna_sweeper._in_flight import trials_in_flight
from tests.conftest import run_optuna_study as run_study
from tests.conftest import run_sphere_config
from tests.sweeper_helpers import max_overlap, ran_jobs

# every CLI run here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")

IDLE_LINE = (
    "furcate_optuna: hydra.sweeper.n_jobs=1 keeps 1 trial in flight while the launcher has "
    "2 slots: 1 slot idle; remove n_jobs (one trial per slot) or set it to 2"
)


def load_study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")


@pytest.mark.parametrize(
    "n_jobs, at_once, idle_lines",
    [
        # hydra-optuna-sweeper's example says n_jobs: 1: one trial at a time, said once
        (["hydra.sweeper.n_jobs=1"], 1, 1),
        ([], 2, 0),  # unset: a trial on every slot, nothing to say
    ],
    ids=["n_jobs_1", "n_jobs_unset"],
)
def test_n_jobs_is_the_number_of_trials_in_flight(
    tmp_path: Path, n_jobs: list[str], at_once: int, idle_lines: int
) -> None:
    result = run_study(tmp_path, *n_jobs, "sleep=0.5")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count(IDLE_LINE) == idle_lines, output
    assert output.count("hydra.sweeper.n_jobs=") == idle_lines  # no other line about it
    jobs = ran_jobs(tmp_path / "sweep")
    assert len(jobs) == 6
    assert max_overlap((job.started_at, job.ended_at) for job in jobs.values()) == at_once
    assert [t.state for t in load_study(tmp_path).trials] == [TrialState.COMPLETE] * 6


def test_a_config_after_the_readmes_two_line_edit_runs_on_the_slots(tmp_path: Path) -> None:
    launcher = ["hydra/launcher=furcate", "hydra.launcher.preload=[]", "hydra.launcher.gpus=[0,1]"]
    result = run_sphere_config(tmp_path, "migrated", *launcher)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(IDLE_LINE) == 1, result.stdout
    study = optuna.load_study(study_name="sphere", storage=f"sqlite:///{tmp_path}/sweep/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert (tmp_path / "sweep" / "optimization_results.yaml").exists()


@pytest.mark.parametrize(
    "n_jobs, slots, to_run, batches, expected, said",
    [
        (None, 4, 20, False, 4, None),
        (None, 4, 20, True, 4, None),
        (4, 4, 20, False, 4, None),
        (
            1,
            4,
            20,
            False,
            1,
            "n_jobs=1 keeps 1 trial in flight while the launcher has 4 slots: "
            "3 slots idle; remove n_jobs (one trial per slot) or set it to 4",
        ),
        (2, 4, 20, True, 2, "keeps 2 trials in flight while the launcher has 4 slots: 2 slots"),
        (1, 4, 1, False, 1, None),  # one trial left: no slot idles for n_jobs
        (8, 2, 20, False, 2, "n_jobs=8 is more than the launcher's 2 slots: 2 trials run at once"),
        (8, 2, 2, False, 2, None),  # no more trials than slots: nothing to say
        (8, 2, 20, True, 8, None),  # hydra-optuna-sweeper's batches: 8 queued in the launcher
    ],
)
def test_n_jobs_against_the_slots_says_once_what_it_does(
    caplog: pytest.LogCaptureFixture,
    n_jobs: int | None,
    slots: int,
    to_run: int,
    batches: bool,
    expected: int,
    said: str | None,
) -> None:
    caplog.set_level(logging.INFO, logger="hydra_plugins.furcate_optuna_sweeper._in_flight")
    assert trials_in_flight(n_jobs, slots, to_run, batches=batches) == expected
    lines = [record.getMessage() for record in caplog.records]
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1 and said in lines[0], lines


@pytest.mark.parametrize("asynchronous", ["true", pytest.param("false", marks=pytest.mark.slow)])
def test_a_study_whose_every_trial_failed_ends_with_one_line_and_its_records(
    tmp_path: Path, asynchronous: str
) -> None:
    # max_failure_rate 1.0 lets every trial run; hydra-optuna-sweeper then raises from
    # study.best_trial ("No trials are completed yet")
    tolerant = ["mode=raise", "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.n_trials=4"]
    result = run_study(tmp_path, *tolerant, f"hydra.sweeper.asynchronous={asynchronous}")
    assert result.returncode == 1, result.stderr
    line = (
        "furcate_optuna: all 4 trials of study 'optuna_app' failed, none completed: no best "
        "params. The first failure: trial 0 (job #0): ValueError: the task raised on purpose; "
        f"logs: {tmp_path / 'sweep' / '0' / 'stderr.log'}"
    )
    assert _closing_line(result.stderr) == line, result.stderr
    assert [t.state for t in load_study(tmp_path).trials] == [TrialState.FAIL] * 4
    # the records were written before the exit; there are no results to write
    sweep = tmp_path / "sweep"
    rows = (sweep / "run_data.csv").read_text().splitlines()[1:]
    assert len(rows) == 4 and all(",FAILED," in row for row in rows)
    assert "| failed | 4 |" in (sweep / "summary.md").read_text()
    assert not (sweep / "optimization_results.yaml").exists()

    # a rerun has nothing left to run, and ends the same way, with the way out
    again = run_study(tmp_path, *tolerant, sweep="again")
    assert again.returncode == 1, again.stderr
    assert "4 of 4 trials already in the study, 0 to run" in again.stdout
    closing = _closing_line(again.stderr)
    assert closing.startswith(
        "furcate_optuna: all 4 trials of study 'optuna_app' failed, none completed: no best "
        "params. The first failure: trial 0: the task raised on purpose (MLflow run "
    )
    assert closing.endswith(
        ". Fix the task, then start another study (hydra.sweeper.study_name=<new name>) or "
        "raise hydra.sweeper.n_trials"
    )


def test_a_study_of_pruned_trials_is_not_a_failure(tmp_path: Path) -> None:
    # a pruned trial ran as it should: the pruner stopped it. No best params, no error
    result = run_study(
        tmp_path, "+prune_at=0", "hydra.sweeper.monitor=loss", "hydra.sweeper.n_trials=3"
    )
    assert result.returncode == 0, result.stderr
    assert "study 'optuna_app' has no completed trial yet: no results" in result.stdout
    assert [t.state for t in load_study(tmp_path).trials] == [TrialState.PRUNED] * 3


def _closing_line(stderr: str) -> str:
    """The line Hydra printed of the sweep's own error, before its HYDRA_FULL_ERROR hint (the
    jobs' tracebacks come before it); the only line of the sweep's error in stderr."""
    lines = [text for text in stderr.splitlines() if text.strip()]
    assert lines[-1].startswith("Set the environment variable HYDRA_FULL_ERROR=1"), stderr
    assert stderr.count("furcate_optuna: ") == 1, stderr
    return lines[-2]


def test_search_space_beside_params_is_ignored_with_a_warning(tmp_path: Path) -> None:
    # hydra-optuna-sweeper's test config of the deprecated search_space (x), with params (y)
    # beside it: as there, the space is params, and search_space is dropped with a warning
    result = run_sphere_config(
        tmp_path,
        "deprecated_search_space",
        "hydra.sweeper.n_trials=4",
        "+hydra.sweeper.params.y='choice(-5, 0, 5)'",
    )
    assert result.returncode == 0, result.stderr
    warning = (
        "UserWarning: Both hydra.sweeper.params and hydra.sweeper.search_space are configured: "
        "the search space is hydra.sweeper.params, and hydra.sweeper.search_space "
        "(x: range(-5.5, 5.5, step=0.5)) is ignored, as hydra-optuna-sweeper ignores it. "
        "Delete hydra.sweeper.search_space, or move what it should add into hydra.sweeper.params"
    )
    assert result.stderr.count(warning) == 1, result.stderr
    assert "is deprecated" not in result.stderr  # search_space is not read at all
    study = optuna.load_study(study_name="sphere", storage=f"sqlite:///{tmp_path}/sweep/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    for trial in study.trials:
        assert set(trial.params) == {"y"} and trial.params["y"] in (-5, 0, 5)
        assert trial.value == 1 + trial.params["y"] ** 2  # x stays the config's 1
