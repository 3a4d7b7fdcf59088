"""OptunaPruning against a real sqlite Optuna storage: real fits on CPU, real processes."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import optuna
import pytest

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.tuning.pruners import pruner_from_spec

STUDY = "sweep"
MEDIAN = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_with_one_complete_trial(tmp_path: Path, intermediate: float) -> tuple[str, int]:
    """What the sweeper leaves: a finished trial with ``intermediate`` each epoch, one asked.

    Returns:
        The storage URL and the asked (RUNNING) trial's number.
    """
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name=STUDY, storage=url, direction="minimize")
    study.add_trial(
        optuna.trial.create_trial(
            value=intermediate, intermediate_values=dict.fromkeys(range(10), intermediate)
        )
    )
    return url, study.ask().number


def stored_trial(url: str, number: int) -> optuna.trial.FrozenTrial:
    return optuna.load_study(study_name=STUDY, storage=url).trials[number]


def test_a_trial_worse_than_the_median_stops_early_and_says_so(tmp_path: Path) -> None:
    # the tiny model's val_loss on random targets is ~1, far worse than 0.001
    from furcate_hydra.lightning import OptunaPruning
    from tests.lightning_helpers import run_fit, standalone_env

    url, number = study_with_one_complete_trial(tmp_path, intermediate=0.001)
    pruning = OptunaPruning(url, STUDY, number, "val_loss", pruner=MEDIAN)

    model, result = run_fit(standalone_env(tmp_path), max_epochs=4, callbacks=[pruning])

    assert pruning.pruned
    assert pruning.pruned_at_epoch == 0
    assert model.epochs_run == [0]
    assert result.epochs_completed < 4
    trial = stored_trial(url, number)
    assert trial.intermediate_values == pruning.reported
    assert list(pruning.reported) == [0]
    assert pruning.reported[0] > 0.001
    assert trial.system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0
    # the job only stops; telling the trial PRUNED is the sweeper's part
    assert trial.state == optuna.trial.TrialState.RUNNING
    assert result.checkpoint_path is not None


def test_a_good_trial_runs_every_epoch(tmp_path: Path) -> None:
    from furcate_hydra.lightning import OptunaPruning
    from tests.lightning_helpers import run_fit, standalone_env

    url, number = study_with_one_complete_trial(tmp_path, intermediate=1e6)
    pruning = OptunaPruning(url, STUDY, number, "val_loss", pruner=MEDIAN)

    model, _ = run_fit(standalone_env(tmp_path), max_epochs=3, callbacks=[pruning])

    assert not pruning.pruned
    assert pruning.pruned_at_epoch is None
    assert model.epochs_run == [0, 1, 2]
    trial = stored_trial(url, number)
    assert trial.intermediate_values == pruning.reported
    assert sorted(pruning.reported) == [0, 1, 2]
    assert env_vars.PRUNED_AT_EPOCH_ATTR not in trial.system_attrs


def test_a_validation_the_app_runs_after_fit_is_not_one_of_the_trials_epochs(
    tmp_path: Path,
) -> None:
    import pytorch_lightning as pl

    from furcate_hydra.lightning import OptunaPruning
    from tests.lightning_helpers import OPTIONS, TinyModule, loaders

    url, number = study_with_one_complete_trial(tmp_path, intermediate=1e6)
    pruning = OptunaPruning(url, STUDY, number, "val_loss", pruner=MEDIAN)
    data = loaders()
    trainer = pl.Trainer(
        **{**OPTIONS, "max_epochs": 2}, callbacks=[pruning], default_root_dir=tmp_path
    )
    model = TinyModule()
    trainer.fit(model, data["train_dataloaders"], data["val_dataloaders"])
    trainer.validate(model, data["val_dataloaders"], verbose=False)

    assert sorted(pruning.reported) == [0, 1]
    assert sorted(stored_trial(url, number).intermediate_values) == [0, 1]


def test_a_missing_metric_warns_once_naming_the_logged_ones_and_the_fit_goes_on(
    tmp_path: Path,
) -> None:
    from furcate_hydra.lightning import OptunaPruning
    from tests.lightning_helpers import run_fit, standalone_env

    url, number = study_with_one_complete_trial(tmp_path, intermediate=1.0)
    pruning = OptunaPruning(url, STUDY, number, "val_acc")
    with pytest.warns(UserWarning, match=r"monitor='val_acc' is not among .*val_loss") as caught:
        _, result = run_fit(standalone_env(tmp_path), max_epochs=3, callbacks=[pruning])
    assert result.epochs_completed == 3
    assert len([w for w in caught if "val_acc" in str(w.message)]) == 1
    assert pruning.reported == {} and not pruning.pruned


def test_from_environ_outside_the_optuna_sweeper_is_a_callback_that_does_nothing(
    tmp_path: Path,
) -> None:
    import lightning.pytorch as L

    from furcate_hydra.lightning import OptunaPruning
    from tests.lightning_helpers import OPTIONS

    assert not OptunaPruning.from_environ({}).active
    empty = {env_vars.OPTUNA_STORAGE: "", env_vars.OPTUNA_STUDY: ""}
    assert not OptunaPruning.from_environ(empty).active
    # a single run that shares the callbacks config: a Trainer of either namespace takes it
    idle: Any = OptunaPruning.from_environ({})  # typed as pytorch_lightning's Callback
    trainer: Any = L.Trainer(max_epochs=1, callbacks=[idle], default_root_dir=tmp_path, **OPTIONS)
    assert idle in trainer.callbacks
    assert not idle.report(1.0, 0)


def test_from_environ_builds_the_callback_and_its_pruner() -> None:
    from furcate_hydra.lightning import OptunaPruning

    pruning = OptunaPruning.from_environ(
        {
            env_vars.OPTUNA_STORAGE: "sqlite:///optuna.db",
            env_vars.OPTUNA_STUDY: STUDY,
            env_vars.OPTUNA_TRIAL_NUMBER: "7",
            env_vars.OPTUNA_MONITOR: "val_loss",
            env_vars.OPTUNA_PRUNER: json.dumps({"name": "percentile", "percentile": 25.0}),
        }
    )
    assert pruning is not None
    assert (pruning.storage, pruning.study_name, pruning.trial_number, pruning.monitor) == (
        "sqlite:///optuna.db",
        STUDY,
        7,
        "val_loss",
    )
    assert isinstance(pruning.pruner, optuna.pruners.PercentilePruner)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({env_vars.OPTUNA_STORAGE: "sqlite:///x.db"}, "FURCATE_OPTUNA_STUDY"),
        (
            {
                env_vars.OPTUNA_STORAGE: "s",
                env_vars.OPTUNA_STUDY: "s",
                env_vars.OPTUNA_TRIAL_NUMBER: "first",
                env_vars.OPTUNA_MONITOR: "m",
            },
            "FURCATE_OPTUNA_TRIAL_NUMBER='first'",
        ),
    ],
)
def test_from_environ_rejects_a_partial_or_bad_environment(env: dict[str, str], match: str) -> None:
    from furcate_hydra.lightning import OptunaPruning

    with pytest.raises(FurcateConfigError, match=match):
        OptunaPruning.from_environ(env)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_pruner_specs() -> None:
    patient = pruner_from_spec(
        '{"name": "patient", "patience": 2, "wrapped_pruner": {"name": "median"}}'
    )
    assert isinstance(patient, optuna.pruners.PatientPruner)
    with pytest.raises(FurcateConfigError, match=r"unknown pruner 'mean'; known: \["):
        pruner_from_spec({"name": "mean"})
    with pytest.raises(FurcateConfigError, match="median rejects these arguments"):
        pruner_from_spec({"name": "median", "patience": 1})
    with pytest.raises(FurcateConfigError, match="not a JSON object"):
        pruner_from_spec("median")


def test_multi_objective_studies_are_left_alone_with_one_warning(tmp_path: Path) -> None:
    from furcate_hydra.lightning import OptunaPruning

    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name=STUDY, storage=url, directions=["minimize"] * 2)
    pruning = OptunaPruning(url, STUDY, study.ask().number, "val_loss")
    with pytest.warns(UserWarning, match="2 objectives"):
        assert not pruning.report(1.0, 0)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert not pruning.report(1.0, 1)
    assert again == []
    assert pruning.reported == {}
    assert stored_trial(url, 0).intermediate_values == {}


STEPS = 40


def report_steps(url: str, number: int, start: Event) -> None:
    """One job's reporting loop, in its own process, without Lightning."""
    from furcate_hydra.lightning import OptunaPruning

    pruning = OptunaPruning(url, STUDY, number, "val_loss", optuna.pruners.NopPruner())
    start.wait()
    for epoch in range(STEPS):
        pruning.report(float(number + epoch), epoch)


def report_concurrently(url: str, numbers: list[int], exit_codes: Connection) -> None:
    """In a fresh process that imported this module once: one forked process per trial, as
    the launcher's fork server forks jobs, all let go at once; sends back their exit codes."""
    import furcate_hydra.lightning._pruning  # noqa: F401  # loaded here, before the forks

    context = multiprocessing.get_context("fork")
    start = context.Event()
    jobs = [context.Process(target=report_steps, args=(url, n, start)) for n in numbers]
    for job in jobs:
        job.start()
    start.set()
    for job in jobs:
        job.join(timeout=120)
    exit_codes.send([job.exitcode for job in jobs])


def test_concurrent_jobs_report_to_one_sqlite_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name=STUDY, storage=url)
    numbers = [study.ask().number for _ in range(3)]
    # Spawned, not forked from this process (its threads and open connections stay here);
    # its children are forked so that Lightning, which OptunaPruning imports, loads once.
    context = multiprocessing.get_context("spawn")
    received, sent = context.Pipe(duplex=False)
    host = context.Process(target=report_concurrently, args=(url, numbers, sent))
    host.start()
    sent.close()
    assert received.poll(timeout=240), "the reporting processes did not finish"
    exit_codes = received.recv()
    host.join(timeout=60)
    assert host.exitcode == 0
    assert exit_codes == [0] * len(numbers)
    for number in numbers:
        expected = {epoch: float(number + epoch) for epoch in range(STEPS)}
        assert stored_trial(url, number).intermediate_values == expected
