"""The sweeper's sqlite study served through Optuna's gRPC proxy: a job in its own process
reports to its trial and is pruned through it; the proxy stops; a bad address is named."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.tuning.storage import rdb_storage

pytest.importorskip("grpc", reason="gRPC is not installed: pip install 'furcate-hydra[ray]'")

from furcate_hydra.tuning.proxy import StudyProxy, open_job_storage

KEY = "hydra.sweeper.storage_proxy"

# A trial's job, as a Lightning job's pruning callback runs it: report, should_prune.
JOB = """
import json, sys
from furcate_hydra.lightning import OptunaPruning
from furcate_hydra.tuning.pruners import pruner_from_spec
callback = OptunaPruning(sys.argv[1], "s", int(sys.argv[2]), "val_loss",
                         pruner_from_spec('{"name": "median", "n_startup_trials": 2}'))
print(json.dumps([callback.report(10.0 + epoch, epoch) for epoch in range(3)]))
"""


def study_with_two_good_trials(url: str) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=rdb_storage(url))
    for _ in range(2):
        trial = study.ask()
        for epoch in range(3):
            trial.report(1.0, epoch)
        study.tell(trial, 1.0)
    return study


def test_a_job_is_pruned_through_the_proxy_and_a_stopped_proxy_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = study_with_two_good_trials(url)
    trial = study.ask()
    proxy = StudyProxy(url, "127.0.0.1", 0, KEY)
    try:
        assert proxy.url == f"grpc://127.0.0.1:{proxy.port}" and proxy.port > 0
        done = subprocess.run(
            [sys.executable, "-c", JOB, proxy.url, str(trial.number)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stderr
    # worse than the median of the finished trials at every epoch: pruned at the first
    assert done.stdout.strip().splitlines()[-1] == "[true, true, true]"
    stored = study._storage.get_trial(trial._trial_id)  # the sqlite file, not the proxy
    assert stored.intermediate_values == {0: 10.0, 1: 11.0, 2: 12.0}
    assert stored.system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == 0

    with pytest.raises(FurcateConfigError) as raised:
        open_job_storage(proxy.url, env_vars.OPTUNA_STORAGE, connect_timeout_s=1.0)
    message = str(raised.value)
    assert f"Invalid {env_vars.OPTUNA_STORAGE}='{proxy.url}'" in message
    assert "no Optuna gRPC proxy answered there within 1 s" in message
    assert "Fix: check that this node reaches that address" in message


def test_a_proxy_address_that_cannot_be_bound_is_named_with_its_fix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study_with_two_good_trials(url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(FurcateConfigError) as raised:
            StudyProxy(url, "127.0.0.1", port, KEY)
    message = str(raised.value)
    assert f"Invalid {KEY}='127.0.0.1:{port}'" in message
    assert "Optuna's gRPC proxy for the study cannot listen there" in message
    assert f"Fix: set {KEY}=HOST:PORT" in message


@pytest.mark.parametrize("url", ["grpc://127.0.0.1", "grpc://:13000", "grpc://h:port"])
def test_a_malformed_proxy_url_in_a_job_is_named(url: str) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        open_job_storage(url, env_vars.OPTUNA_STORAGE)
    assert f"Invalid {env_vars.OPTUNA_STORAGE}='{url}': is not grpc://HOST:PORT" in str(
        raised.value
    )


def test_an_optuna_without_the_proxy_modules_is_named_with_the_rdb_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study_with_two_good_trials(url)
    # as if a later Optuna moved its private proxy modules
    monkeypatch.setitem(sys.modules, "optuna.storages._grpc.servicer", None)
    with pytest.raises(FurcateConfigError) as raised:
        StudyProxy(url, "127.0.0.1", 0, KEY)
    message = str(raised.value)
    assert KEY in message and "gRPC proxy cannot be started here" in message
    assert "postgresql+psycopg2://" in message
