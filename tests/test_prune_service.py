"""The sweeper's prune service: jobs report over loopback HTTP and the sweeper decides on the
study it holds. Real sqlite Optuna storage, real HTTP server and client."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from furcate_hydra import env_vars
from furcate_hydra.lightning import OptunaPruning
from furcate_hydra.tuning.prune_service import PruneService
from tests.test_store_server import free_port

STUDY = "sweep"

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    """The sweeper's study: three finished trials at 1.0 each epoch (lower is better)."""
    study = optuna.create_study(
        study_name=STUDY,
        storage=f"sqlite:///{tmp_path}/optuna.db",
        direction="minimize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    for _ in range(3):
        study.add_trial(
            optuna.trial.create_trial(value=1.0, intermediate_values=dict.fromkeys(range(5), 1.0))
        )
    return study


@pytest.fixture
def service() -> Iterator[PruneService]:
    service = PruneService()
    service.serve()
    yield service
    service.stop()


def post(url: str, body: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def report(service: PruneService, number: int, step: Any, value: float) -> tuple[int, Any]:
    """Trial ``number``'s report, as its job sends it: with its token."""
    body = {"trial": number, "step": step, "value": value}
    return post(service.url, body, service.token(number))


def stored(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return study.get_trials(deepcopy=False)[number]


def test_the_sweeper_records_the_report_and_decides_on_its_study(
    study: optuna.Study, service: PruneService
) -> None:
    assert service.url.startswith("http://127.0.0.1:")
    bad, good = study.ask(), study.ask()
    service.add(bad)
    service.add(good)

    assert report(service, good.number, 0, 0.5) == (
        200,
        {"prune": False},
    )
    assert report(service, bad.number, 0, 9.0) == (
        200,
        {"prune": True},
    )
    assert stored(study, good.number).intermediate_values == {0: 0.5}
    assert stored(study, bad.number).intermediate_values == {0: 9.0}
    assert stored(study, bad.number).system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0
    assert env_vars.PRUNED_AT_EPOCH_ATTR not in stored(study, good.number).system_attrs

    # a step reported again (a job resumed inside an epoch) keeps its first value, silently;
    # the epoch that got it pruned stays the first one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report(service, bad.number, 0, 0.1)[0] == 200
        assert report(service, bad.number, 1, 9.0)[1]["prune"]
    assert stored(study, bad.number).intermediate_values == {0: 9.0, 1: 9.0}
    assert stored(study, bad.number).system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0


def test_reports_it_cannot_take_are_refused_with_why(
    study: optuna.Study, service: PruneService
) -> None:
    trial = study.ask()
    status, answer = report(service, trial.number, 0, 1.0)
    assert (status, answer["error"]) == (404, f"trial {trial.number} is not running in this sweep")
    service.add(trial)
    status, answer = report(service, trial.number, "x", 1.0)
    assert status == 400 and "{trial, step, value}" in answer["error"]
    service.discard(trial)  # told: its job reports no more
    assert report(service, trial.number, 0, 1.0)[0] == 404
    assert stored(study, trial.number).intermediate_values == {}


def test_a_report_without_its_trials_token_is_refused_and_the_study_unchanged(
    study: optuna.Study, service: PruneService, caplog: pytest.LogCaptureFixture
) -> None:
    # any local user reaches the loopback port: a report needs the token its trial's job got
    mine, other = study.ask(), study.ask()
    service.add(mine)
    service.add(other)
    body = {"trial": mine.number, "step": 0, "value": 9.0}
    with caplog.at_level("WARNING"):
        refused = (401, {"error": f"not trial {mine.number}'s token"})
        assert post(service.url, body, None) == refused
        assert post(service.url, body, "guess") == refused
        # a job's own token speaks for its trial alone
        assert post(service.url, body, service.token(other.number)) == refused
    assert caplog.text.count(f"refused a report for trial {mine.number}") == 1  # logged once
    assert "carried no token" in caplog.text and service.token(other.number) not in caplog.text
    # a trial the service was not given is refused, whatever the token
    never = study.ask()
    not_given = (404, {"error": f"trial {never.number} is not running in this sweep"})
    assert report(service, never.number, 0, 9.0) == not_given
    # nothing reached the study: no value, no prune mark, every trial still running
    for trial in (mine, other, never):
        frozen = stored(study, trial.number)
        assert frozen.intermediate_values == {} and frozen.state.name == "RUNNING"
        assert env_vars.PRUNED_AT_EPOCH_ATTR not in frozen.system_attrs
    # a body too long to be a report is not read
    big = {"trial": mine.number, "step": 0, "value": 1.0, "pad": "x" * 5000}
    assert post(service.url, big, service.token(mine.number))[0] == 400
    assert report(service, mine.number, 0, 9.0) == (200, {"prune": True})


def test_a_job_reports_through_the_service_and_opens_no_storage(
    study: optuna.Study, service: PruneService, tmp_path: Path
) -> None:
    def job(trial: optuna.Trial) -> OptunaPruning:
        service.add(trial)
        # a storage URL the job could not open: the service alone answers
        missing = f"sqlite:///{tmp_path}/missing/optuna.db"
        token = service.token(trial.number)
        return OptunaPruning(
            missing, STUDY, trial.number, "val_loss", service_url=service.url, service_token=token
        )

    good, bad = job(study.ask()), job(study.ask())
    assert not good.report(0.5, 0) and not good.report(0.4, 1)
    assert bad.report(7.0, 0)
    assert (good.pruned_at_epoch, bad.pruned_at_epoch) == (None, 0)
    assert good.reported == {0: 0.5, 1: 0.4} and good.service_url == service.url
    assert stored(study, bad.trial_number).system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0


def test_a_job_whose_service_does_not_answer_reports_to_the_storage_itself(
    study: optuna.Study, tmp_path: Path
) -> None:
    trial = study.ask()
    url = f"http://127.0.0.1:{free_port()}/report"  # nothing listens there
    pruning = OptunaPruning(
        f"sqlite:///{tmp_path}/optuna.db", STUDY, trial.number, "val_loss",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        service_url=url,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"pruning service at .* did not decide trial") as seen:
        assert pruning.report(9.0, 0)
        assert pruning.report(9.0, 1)
    assert len(seen) == 1  # once: then straight to the storage
    assert pruning.service_url is None
    assert stored(study, trial.number).intermediate_values == {0: 9.0, 1: 9.0}
    assert stored(study, trial.number).system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0


def test_from_environ_takes_the_service_url() -> None:
    env = {
        env_vars.OPTUNA_STORAGE: "sqlite:///optuna.db",
        env_vars.OPTUNA_STUDY: STUDY,
        env_vars.OPTUNA_TRIAL_NUMBER: "3",
        env_vars.OPTUNA_MONITOR: "val_loss",
        env_vars.OPTUNA_PRUNE_URL: "http://127.0.0.1:5555/report",
        env_vars.OPTUNA_PRUNE_TOKEN: "the trial's token",
    }
    assert OptunaPruning.from_environ(env).service_url == "http://127.0.0.1:5555/report"
    assert OptunaPruning.from_environ(env)._service_token == "the trial's token"
    del env[env_vars.OPTUNA_PRUNE_URL]
    assert OptunaPruning.from_environ(env).service_url is None


@pytest.mark.usefixtures("mlflow_store")
def test_a_sweep_prunes_through_its_service_on_this_machine(tmp_path: Path) -> None:
    """Through the CLI: furcate's launcher gives each trial's job the service's loopback URL
    and the pruner stops trials there."""
    from tests.conftest import run_optuna_study

    result = run_optuna_study(
        tmp_path,
        "+epochs=4",
        "+odd_jobs_worse=true",
        "hydra.sweeper.monitor=loss",
        "hydra.sweeper.n_trials=8",
        "hydra.sweeper.pruner.n_startup_trials=2",
        "hydra.sweeper.pruner.n_warmup_steps=0",
        "hydra.launcher.preload=[furcate_hydra.lightning]",  # once, not in each job
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pruning service" not in result.stdout + result.stderr
    study = optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = study.get_trials(deepcopy=False)
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    # jobs 0 and 1 are the pruner's startup trials; from then on each odd one is pruned
    assert len(trials) == 8 and len(pruned) >= 2, [t.state for t in trials]
    for trial in pruned:
        assert trial.system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == max(trial.intermediate_values)
    urls = {
        json.loads(path.read_text())["optuna_prune_url"]
        for path in (tmp_path / "sweep").glob("*/probe.json")
    }
    assert len(urls) == 1
    (url,) = urls
    assert url is not None and url.startswith("http://127.0.0.1:"), url
    for path in (tmp_path / "sweep").glob("*/reported.json"):
        reported = json.loads(path.read_text())
        assert reported["reported"], path


def test_a_service_never_asked_to_serve_stops_at_once() -> None:
    service = PruneService()
    service.stop()  # its thread never started: nothing to wait for
    with pytest.raises(urllib.error.URLError):
        report(service, 0, 0, 1.0)


@pytest.mark.parametrize("asynchronous", ["true", "false"])
def test_a_study_that_prunes_here_forks_its_launchers_server_first(
    run_study_in_process: Any, monkeypatch: pytest.MonkeyPatch, asynchronous: str
) -> None:
    """The prune service's thread starts after the launcher's fork server: the server is
    then a fork of the sweeper's process, not a new interpreter importing it all again."""
    from furcate_hydra.execution.forkserver.fork import spawn_server as new_interpreter

    spawned: list[str] = []

    def spawn_server(*args: Any) -> Any:
        spawned.append(str([thread.name for thread in threading.enumerate()]))
        return new_interpreter(*args)

    # where the launcher's client looks it up
    monkeypatch.setattr("furcate_hydra.execution.forkserver.client.spawn_server", spawn_server)
    run_study_in_process(
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.monitor=loss",
        f"hydra.sweeper.asynchronous={asynchronous}",
        "+prune_at=3",
    )
    assert spawned == []
    study = optuna.load_study(study_name="optuna_app", storage="sqlite:///optuna.db")
    states = [trial.state for trial in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.PRUNED] * 2  # the service answered its jobs
