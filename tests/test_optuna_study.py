"""The study's bookkeeping on a real sqlite storage: what counts toward n_trials, what is
recovered from a dead sweep, and how a job's return is read for Optuna."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.layout import SweepPaths
from hydra_plugins.furcate_optuna_sweeper._options import job_storage_url
from hydra_plugins.furcate_optuna_sweeper._outcome import read_outcome
from hydra_plugins.furcate_optuna_sweeper._study import (
    Attrs,
    ask_owned,
    counts,
    open_study,
    recover_trials,
    shown_url,
    study_storage,
    sweeper_identity,
)
from hydra_plugins.furcate_optuna_sweeper._study_sweep import StudySweep
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper
from tests.store_helpers import exited_launcher

optuna.logging.set_verbosity(optuna.logging.WARNING)


def new_study(tmp_path: Path, directions: tuple[str, ...] = ("minimize",)) -> optuna.Study:
    sampler = optuna.samplers.RandomSampler(seed=0)
    return open_study(f"sqlite:///{tmp_path}/optuna.db", "s", directions, sampler, None)


X: dict[str, BaseDistribution] = {"x": optuna.distributions.FloatDistribution(0, 1)}


def running_trial(study: optuna.Study, identity: str | None) -> optuna.Trial:
    trial = study.ask(X)
    if identity is not None:
        study._storage.set_trial_system_attr(trial._trial_id, Attrs.SWEEPER, identity)
    return trial


def test_trials_of_a_dead_sweep_fail_and_are_enqueued_once(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    done = running_trial(study, sweeper_identity())
    study.tell(done, 1.0)
    dead = running_trial(study, json.dumps(exited_launcher().tags()))
    alive = running_trial(study, sweeper_identity())  # this process: still running it
    foreign = running_trial(study, None)  # asked by someone else: theirs to tell

    state = recover_trials(study, sweeper_identity(), X)
    assert (state.recovered, state.retried, state.running_elsewhere) == (1, 1, 2)
    assert state.counted == 3  # the completed one and the two still running
    frozen = study.trials[dead.number]
    assert frozen.state is TrialState.FAIL
    assert "has exited" in frozen.system_attrs[Attrs.INTERRUPTED]
    assert study.trials[alive.number].state is TrialState.RUNNING
    assert study.trials[foreign.number].state is TrialState.RUNNING
    # the queued retry already names the sweeper that enqueued it: popped, it is never
    # RUNNING without an owner a rerun can check
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    assert queued.system_attrs[Attrs.SWEEPER] == sweeper_identity()
    # the retry is asked next, with the dead trial's params
    retry = ask_owned(study, X, "the asking sweeper")
    assert retry.params == frozen.params
    assert retry.user_attrs[Attrs.RETRY_OF] == dead.number
    assert study.trials[retry.number].system_attrs[Attrs.SWEEPER] == "the asking sweeper"
    assert not study.get_trials(states=(TrialState.WAITING,))  # no placeholder left behind
    # a later sweep does not enqueue it again
    assert recover_trials(study, sweeper_identity(), X).retried == 0


def test_an_asked_trial_is_owned_from_its_first_write(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    storage = study._storage
    real_create = storage.create_new_trial
    created: list[FrozenTrial] = []

    def create_and_look(*args: Any, **kwargs: Any) -> int:
        an_id: int = real_create(*args, **kwargs)
        created.append(storage.get_trial(an_id))  # its first write, before anything else
        return an_id

    storage.create_new_trial = create_and_look  # type: ignore[method-assign]
    trials = [ask_owned(study, X, f"sweeper {i}") for i in range(3)]
    # a sweep killed right after its first write leaves a trial that names its sweeper
    assert [t.state for t in created] == [TrialState.RUNNING] * 3
    assert [t.system_attrs[Attrs.SWEEPER] for t in created] == [f"sweeper {i}" for i in range(3)]
    assert [t.number for t in trials] == [0, 1, 2]
    assert all(0 <= t.params["x"] <= 1 for t in trials)  # sampled as ask samples
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_a_queued_retry_is_run_by_the_first_sweeper_to_claim_it(tmp_path: Path) -> None:
    # two sweepers of one study (a job array's launchers), each its own connection and cache
    study = new_study(tmp_path)
    rival = new_study(tmp_path)  # another sweeper's process: its own connection and cache
    mine = ask_owned(study, X, "sweeper A")
    theirs = ask_owned(rival, X, "sweeper B")
    # a retry queued while both ask: the first to claim it runs it, the other gets a new trial
    study.enqueue_trial({"x": 0.5})
    first = ask_owned(rival, X, "sweeper B")
    second = ask_owned(study, X, "sweeper A")
    assert first.params == {"x": 0.5} and second.params != {"x": 0.5}
    for trial in (mine, theirs, first, second):
        study.tell(trial, 1.0)
    frozen = study.get_trials()
    assert [t.state for t in frozen] == [TrialState.COMPLETE] * 4
    owners = [t.system_attrs[Attrs.SWEEPER] for t in frozen]
    assert owners == ["sweeper A", "sweeper B", "sweeper B", "sweeper A"]


def test_a_queued_trial_a_rival_claimed_first_is_skipped(tmp_path: Path) -> None:
    # the look at the queue and the claim are two reads: between them another sweeper may
    # have claimed the queued trial; the claim fails and the ask makes its own
    study = new_study(tmp_path)
    study.enqueue_trial({"x": 0.25})
    rival = new_study(tmp_path)
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    real_look = study.get_trials

    def look_then_rival_claims(*args: Any, **kwargs: Any) -> list[FrozenTrial]:
        seen = real_look(*args, **kwargs)
        if kwargs.get("states") == (TrialState.WAITING,) and seen:
            ask_owned(rival, X, "sweeper B")  # pops the queued trial after our look
        return seen

    study.get_trials = look_then_rival_claims  # type: ignore[method-assign]
    trial = ask_owned(study, X, "sweeper A")
    assert trial.number != queued.number
    frozen = {t.number: t for t in real_look()}
    assert frozen[queued.number].system_attrs[Attrs.SWEEPER] == "sweeper B"
    assert frozen[trial.number].system_attrs[Attrs.SWEEPER] == "sweeper A"
    assert frozen[trial.number].state is TrialState.RUNNING
    assert not real_look(states=(TrialState.WAITING,))


def test_a_stopped_sweep_fails_every_trial_it_left_running(tmp_path: Path) -> None:
    # An interrupt inside an ask, or between an ask and its job's submission, leaves a trial
    # RUNNING that no list of the sweep holds: stopping, the sweep fails it all the same,
    # marked for a retry, and leaves other sweepers' trials alone.
    study = new_study(tmp_path)
    owner = sweeper_identity()
    held = ask_owned(study, X, owner)
    lost = ask_owned(study, X, owner)
    done = ask_owned(study, X, owner)
    study.tell(done, 1.0)
    foreign = running_trial(study, "another sweeper")
    sweep = StudySweep.__new__(StudySweep)  # what interrupted() reads of a running sweep
    sweep.study, sweep._identity = study, owner

    sweep.interrupted([held], "sweep stopped: KeyboardInterrupt")
    for trial in (held, lost):
        frozen = study.trials[trial.number]
        assert frozen.state is TrialState.FAIL
        assert frozen.system_attrs[Attrs.INTERRUPTED] == "sweep stopped: KeyboardInterrupt"
    assert study.trials[done.number].state is TrialState.COMPLETE
    assert study.trials[foreign.number].state is TrialState.RUNNING
    assert recover_trials(study, owner, X).retried == 2


def test_a_trial_stopped_inside_its_ask_is_failed_and_not_retried(tmp_path: Path) -> None:
    # Ctrl-C between two params' sampling: the trial never ran and has only some params; its
    # retry would not run the same config, so the next asks sample whole trials instead
    study = new_study(tmp_path)
    owner = sweeper_identity()
    xy = {**X, "y": optuna.distributions.IntDistribution(0, 3)}
    whole = ask_owned(study, xy, owner)
    partial = ask_owned(study, X, owner)  # y never sampled
    sweep = StudySweep.__new__(StudySweep)
    sweep.study, sweep._identity = study, owner
    sweep.interrupted([whole, partial], "sweep stopped: KeyboardInterrupt")

    state = recover_trials(study, owner, xy)
    assert state.retried == 1
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    assert queued.user_attrs[Attrs.RETRY_OF] == whole.number
    assert study.trials[partial.number].state is TrialState.FAIL
    assert not counts(study.trials[partial.number])


def test_what_counts_toward_n_trials(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    for state, attr in [
        (TrialState.COMPLETE, None),
        (TrialState.PRUNED, None),
        (TrialState.FAIL, None),  # the task failed: a trial like any other
        (TrialState.FAIL, Attrs.INTERRUPTED),  # re-tried instead
        (TrialState.FAIL, Attrs.EXCLUDED),  # never ran
    ]:
        trial = running_trial(study, None)
        if attr is not None:
            study._storage.set_trial_system_attr(trial._trial_id, attr, "why")
        study.tell(trial, 1.0 if state is TrialState.COMPLETE else None, state=state)
    assert [counts(t) for t in study.trials] == [True, True, True, False, False]


def test_a_study_cannot_change_its_directions(tmp_path: Path) -> None:
    new_study(tmp_path)
    with pytest.raises(OptionError, match="differs from the directions study 's'"):
        new_study(tmp_path, ("maximize",))


def test_a_new_study_names_its_values_and_keeps_its_names_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, sampler = f"sqlite:///{tmp_path}/optuna.db", optuna.samplers.RandomSampler(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's experimental-API warning is not shown
        study = open_study(url, "s", ("minimize", "maximize"), sampler, None, ("loss", "acc"))
    assert study.metric_names == ["loss", "acc"]
    # names are a study's: a later sweep's other names are not applied, and it says so
    again = open_study(url, "s", ("minimize", "maximize"), sampler, None, ("l", "a"))
    assert again.metric_names == ["loss", "acc"]
    assert "names its values ['loss', 'acc']; kept (not ['l', 'a']" in caplog.text
    # no names to give (monitor and metric_names unset): the study's stay
    caplog.clear()
    assert open_study(url, "s", ("minimize", "maximize"), sampler, None).metric_names == [
        "loss",
        "acc",
    ]
    assert not caplog.text


def test_the_values_are_named_by_metric_names_else_by_the_monitor() -> None:
    def names(**options: Any) -> tuple[str, ...] | None:
        parsed = FurcateOptunaSweeper.parse_options({"pruner": {"name": "none"}, **options})
        return parsed.objective_names

    assert names() is None
    assert names(monitor="val_loss") == ("val_loss",)
    assert names(monitor="val_loss", metric_names="final_loss") == ("final_loss",)
    # two values: the monitor (reported per epoch) names neither
    assert names(monitor="val_loss", direction=["minimize", "maximize"]) is None


def test_relative_sqlite_paths_are_made_absolute_for_jobs(tmp_path: Path) -> None:
    assert job_storage_url("sqlite:///optuna.db", tmp_path) == f"sqlite:///{tmp_path}/optuna.db"
    assert job_storage_url("sqlite:////abs/o.db", tmp_path) == "sqlite:////abs/o.db"
    assert job_storage_url("postgresql://h/db", tmp_path) == "postgresql://h/db"


def test_storage_unset_is_the_shared_default_and_null_a_new_study_in_the_sweep_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sweep = SweepPaths.of(tmp_path / "sweep")
    unset = FurcateOptunaSweeper.parse_options({}).storage
    assert study_storage(unset, sweep) == f"sqlite:///{tmp_path}/optuna.db"  # every run's
    null = FurcateOptunaSweeper.parse_options({"storage": None}).storage
    first = study_storage(null, sweep)
    assert first == f"sqlite:///{tmp_path}/sweep/optuna.db"
    open_study(first, "s", ["minimize"], None, None)
    # a reused sweep dir keeps the earlier study, and this run gets a new one
    assert study_storage(null, sweep) == f"sqlite:///{tmp_path}/sweep/optuna-2.db"


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql://me:secret@db:5432/optuna", "postgresql://me:***@db:5432/optuna"),
        ("postgresql+psycopg2://me:p%40ss@db/optuna?sslmode=require",
         "postgresql+psycopg2://me:***@db/optuna?sslmode=require"),
        ("mysql://me:a:b@[::1]:3306/optuna", "mysql://me:***@[::1]:3306/optuna"),
        ("postgresql://me@db/optuna", "postgresql://me@db/optuna"),  # no password to hide
        ("sqlite:////abs/optuna.db", "sqlite:////abs/optuna.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)  # fmt: skip
def test_a_storage_password_is_not_logged(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def job_return(value: object, status: JobStatus = JobStatus.COMPLETED) -> JobReturn:
    ret = JobReturn()
    ret.status = status
    ret._return_value = value
    return ret


def test_returns_read_as_optuna_outcomes() -> None:
    one = ("minimize",)
    assert read_outcome(job_return(2), one, "job", pruned=False).values == [2.0]
    assert read_outcome(job_return([2.5]), one, "job", pruned=False).values == [2.5]
    pruned = read_outcome(job_return(3.0), one, "job", pruned=True)
    assert pruned.state is TrialState.PRUNED
    # a pruned job need not return a value at all
    assert read_outcome(job_return(None), one, "job", pruned=True).state is TrialState.PRUNED
    nan = read_outcome(job_return(float("nan")), one, "job", pruned=False)
    assert nan.state is TrialState.FAIL and "NaN" in str(nan.error)
    error = ValueError("boom")
    failed = read_outcome(job_return(error, JobStatus.FAILED), one, "job", pruned=False)
    assert failed.state is TrialState.FAIL and failed.error is error
    two = read_outcome(job_return((1, 2)), ("minimize", "maximize"), "job", pruned=False)
    assert two.values == [1.0, 2.0]
