"""The sweeper's sqlite study served through Optuna's gRPC proxy: a job in its own process
reports to its trial and is pruned through it; only calls carrying the sweep's token are
served, in clear text or over TLS, and a refused job is told why; the proxy stops; a bad
address is named. Every proxy listens on loopback."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.tuning.storage import rdb_storage
from tests.tls_helpers import self_signed

pytest.importorskip("grpc", reason="gRPC is not installed: pip install 'furcate-hydra[ray]'")

import grpc

from furcate_hydra.tuning.optuna_private import grpc_proxy_over
from furcate_hydra.tuning.proxy import ProxyTls, StudyProxy, open_job_storage
from furcate_hydra.tuning.proxy_auth import job_channel

KEY = "hydra.sweeper.storage_proxy"
# the sweeper makes one per sweep with secrets.token_urlsafe(32)
TOKEN = "this-sweeps-token"
TOKEN_VAR = env_vars.OPTUNA_PROXY_TOKEN
CERT_VAR = env_vars.OPTUNA_PROXY_TLS_CERT

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


@contextlib.contextmanager
def serving(url: str, tls: ProxyTls | None = None) -> Iterator[StudyProxy]:
    proxy = StudyProxy(url, "127.0.0.1", 0, KEY, token=TOKEN, tls=tls)
    try:
        yield proxy
    finally:
        proxy.stop()


def stored(url: str, number: int) -> FrozenTrial:
    """Trial ``number`` as the sqlite file holds it (not through the proxy)."""
    return optuna.load_study(study_name="s", storage=rdb_storage(url)).trials[number]


def report_through(url: str, environ: Mapping[str, str], number: int, value: float) -> bool:
    """A job's report of ``value`` at epoch 0 to trial ``number``, and whether to prune it."""
    storage = open_job_storage(url, env_vars.OPTUNA_STORAGE, environ=environ)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2)
    study = optuna.load_study(study_name="s", storage=storage, pruner=pruner)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("s"), number
    )
    trial = optuna.Trial(study, trial_id)
    trial.report(value, 0)
    return bool(trial.should_prune())  # numpy's bool otherwise


def optunas_own_client(proxy: StudyProxy) -> optuna.storages.GrpcStorageProxy:
    """What anyone who reaches the port can run: Optuna's client, no token, no TLS."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.GrpcStorageProxy(host=proxy.host, port=proxy.port)


def test_a_job_is_pruned_through_the_proxy_and_a_stopped_proxy_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = study_with_two_good_trials(url)
    trial = study.ask()
    proxy = StudyProxy(url, "127.0.0.1", 0, KEY, token=TOKEN)
    try:
        assert proxy.url == f"grpc://127.0.0.1:{proxy.port}" and proxy.port > 0
        assert proxy.job_env() == {TOKEN_VAR: TOKEN}  # no TLS: no certificate
        done = subprocess.run(  # the token in the job's environment, as the sweeper puts it
            [sys.executable, "-c", JOB, proxy.url, str(trial.number)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **proxy.job_env()},
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
            StudyProxy(url, "127.0.0.1", port, KEY, token=TOKEN)
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
        StudyProxy(url, "127.0.0.1", 0, KEY, token=TOKEN)
    message = str(raised.value)
    assert KEY in message and "gRPC proxy cannot be started here" in message
    assert "postgresql+psycopg2://" in message


@pytest.mark.parametrize("token", [None, "not-this-sweeps-token"])
def test_a_call_without_the_token_is_refused_and_changes_nothing(
    tmp_path: Path, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = study_with_two_good_trials(url)
    trial = study.ask()
    study_id = rdb_storage(url).get_study_id_from_name("s")
    caplog.set_level(logging.WARNING, logger="furcate_hydra.tuning.proxy_auth")
    with serving(url) as proxy:
        if token is None:
            client = optunas_own_client(proxy)
        else:
            channel = job_channel(proxy.host, proxy.port, token, None)
            client = grpc_proxy_over(channel, proxy.host, proxy.port)
        calls: dict[str, Callable[[], object]] = {
            "read the study": client.get_all_studies,
            "add a trial": lambda: client.create_new_trial(study_id),
            "report a value": lambda: client.set_trial_intermediate_value(trial._trial_id, 0, 99.0),
            "finish a trial": lambda: client.set_trial_state_values(
                trial._trial_id, optuna.trial.TrialState.COMPLETE, [0.0]
            ),
        }
        for what, call in calls.items():
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, what
        client.close()
    assert len(optuna.load_study(study_name="s", storage=rdb_storage(url)).trials) == 3
    left = stored(url, trial.number)
    assert left.state == optuna.trial.TrialState.RUNNING and left.intermediate_values == {}
    # one warning per refused address, not one per call
    refusals = [r.getMessage() for r in caplog.records if "refused a call" in r.getMessage()]
    assert len(refusals) == 1 and "from ipv4:127.0.0.1," in refusals[0], refusals
    assert TOKEN not in caplog.text


def test_a_job_with_the_token_reports_and_is_told_to_prune(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = study_with_two_good_trials(url)
    trial = study.ask()
    with serving(url) as proxy:
        # worse than the median (1.0) of the two finished trials at epoch 0
        assert report_through(proxy.url, proxy.job_env(), trial.number, 10.0) is True
    assert stored(url, trial.number).intermediate_values == {0: 10.0}


@pytest.mark.parametrize("environ, shown", [({}, "unset"), ({TOKEN_VAR: "stale-token"}, "set")])
def test_a_job_whose_token_is_refused_is_told_the_variable_and_the_fix(
    tmp_path: Path, environ: dict[str, str], shown: str
) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study_with_two_good_trials(url)
    with serving(url) as proxy, pytest.raises(FurcateConfigError) as raised:
        open_job_storage(proxy.url, env_vars.OPTUNA_STORAGE, environ=environ)
    message = str(raised.value)
    sent = "its token is not this sweep's" if environ else "it sent no token"
    assert message.startswith(
        f"Invalid {TOKEN_VAR}='{shown}': the sweeper's study proxy at {proxy.url} refused "
        f"this job: {sent}. Fix: let the Optuna sweeper set it:"
    ), message
    assert "run the trial from its sweep" in message
    assert "stale-token" not in message  # a token is never shown, only whether it is set


def test_under_tls_a_job_needs_the_token_and_to_trust_the_certificate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = study_with_two_good_trials(url)
    trial = study.ask()
    cert, key = self_signed(tmp_path, "proxy")
    other_cert, _ = self_signed(tmp_path, "other")
    tls = ProxyTls(cert.read_bytes(), key.read_bytes())
    assert "PRIVATE" not in repr(tls)
    with serving(url, tls) as proxy:
        env = proxy.job_env()
        # the certificate travels to the job as text: no node needs the file
        assert env == {TOKEN_VAR: TOKEN, CERT_VAR: cert.read_text()}
        assert report_through(proxy.url, env, trial.number, 10.0) is True

        # TLS does not replace the token
        with pytest.raises(FurcateConfigError) as no_token:
            open_job_storage(proxy.url, env_vars.OPTUNA_STORAGE, environ={CERT_VAR: env[CERT_VAR]})
        assert f"Invalid {TOKEN_VAR}='unset'" in str(no_token.value)

        # a job trusting another certificate never completes the handshake: it is told so
        untrusting = {**env, CERT_VAR: other_cert.read_text()}
        with pytest.raises(FurcateConfigError) as untrusted:
            open_job_storage(proxy.url, env_vars.OPTUNA_STORAGE, 1.0, environ=untrusting)
        message = str(untrusted.value)
        assert f"Invalid {env_vars.OPTUNA_STORAGE}='{proxy.url}'" in message
        assert f"this job speaks TLS to it, trusting the certificate in {CERT_VAR}" in message
        assert "subjectAltName names it (e.g. IP:127.0.0.1)" in message

        # Optuna's own client speaks no TLS: it gets no answer at all
        plain = optunas_own_client(proxy)
        with pytest.raises(ConnectionError):
            plain.wait_server_ready(timeout=1.0)
        with pytest.raises(grpc.RpcError) as unanswered:
            plain.create_new_trial(0)
        assert unanswered.value.code() == grpc.StatusCode.UNAVAILABLE
        plain.close()
    assert stored(url, trial.number).intermediate_values == {0: 10.0}
    assert len(optuna.load_study(study_name="s", storage=rdb_storage(url)).trials) == 3
