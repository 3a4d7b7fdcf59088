"""Bad furcate_optuna input: a message naming the key, the value and the fix; nothing recorded
is lost. Each kind of check runs the real CLI; more bad option values are read in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from hydra.errors import CompactHydraException
from optuna.trial import TrialState

from furcate_hydra.hydra_api.options import OptionError
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper
from tests.conftest import RunStudy
from tests.conftest import run_optuna_study as run_study
from tests.option_helpers import parse_optuna_sweeper_options
from tests.store_helpers import job_runs
from tests.sweeper_helpers import ran_jobs
from tests.tls_helpers import self_signed

CERT, KEY = "hydra.sweeper.storage_proxy_tls_cert", "hydra.sweeper.storage_proxy_tls_key"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["hydra/sweeper/sampler=annealing"],
            ["Could not find 'hydra/sweeper/sampler/annealing'", "tpe", "cmaes", "qmc"],
        ),
        (
            ["hydra/sweeper/pruner=patience"],
            ["Could not find 'hydra/sweeper/pruner/patience'", "median", "hyperband"],
        ),
        (
            ["hydra.sweeper.pruner.name=wilting"],
            ["Invalid hydra.sweeper.pruner=", "wilting", "hydra/sweeper/pruner=median"],
        ),
        (
            ["hydra.sweeper.params.x='interval(0,'"],
            ["Invalid hydra.sweeper.params.x='interval(0,'", "is not a valid search space"],
        ),
        (
            ["hydra/sweeper/sampler=grid"],  # x is an interval: no grid to walk
            ["Invalid hydra.sweeper.params.x=", "the grid sampler needs"],
        ),
        (
            ["hydra.sweeper.exclude=[{yy: 1}]"],
            ["Invalid hydra.sweeper.exclude[0]='yy'", "names a key that is in no config"],
        ),
        (
            ["hydra.sweeper.exclude=[{y: abc}]"],
            [
                "Invalid hydra.sweeper.exclude[0].y='abc': can never match",
                "y is a number in every config the search space can sample (-1, 0, 1)",
            ],
        ),
        (
            ["hydra.sweeper.n_jobs=0"],
            ["Invalid hydra.sweeper.n_jobs=0", "one trial per slot of the launcher"],
        ),
        (
            ["hydra.job.name=../../x"],
            ["Invalid hydra.job.name='../../x'", "outside the sweep dir"],
        ),
        (
            ["hydra.sweeper.storage_proxy_tls_cert=proxy.crt"],
            ["Invalid hydra.sweeper.storage_proxy_tls_key=None", "TLS needs both"],
        ),
    ],
)
def test_bad_options_stop_before_any_trial(
    tmp_path: Path, mlflow_store: str, overrides: list[str], expected: list[str]
) -> None:
    result = run_study(tmp_path, *overrides)
    assert result.returncode != 0
    stderr = result.stderr
    for text in expected:
        assert text in stderr, stderr
    assert "Traceback" not in stderr
    assert not ran_jobs(tmp_path / "sweep")
    assert not job_runs(mlflow_store)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"pruner": {"name": "median", "n_warmup_steps": -1}}, "n_warmup_steps"),
        ({"direction": "sideways"}, "Invalid hydra.sweeper.direction='sideways'"),
        ({"direction": ["minimize", "up"]}, "minimize or maximize, or a list of them"),
        ({"n_trials": 0}, "Invalid hydra.sweeper.n_trials=0: must be a whole number, 1 or more"),
        ({"n_jobs": -2}, "Invalid hydra.sweeper.n_jobs=-2"),
        (
            {"n_jobs": 0},
            "Invalid hydra.sweeper.n_jobs=0: must be a whole number of trials in flight at once, "
            "1 or more. Fix: remove hydra.sweeper.n_jobs (or set it to null) for one trial per "
            "slot of the launcher, or set e.g. hydra.sweeper.n_jobs=4",
        ),
        ({"n_jobs": 1.5}, "Invalid hydra.sweeper.n_jobs=1.5: must be a whole number"),
        ({"n_jobs": "four"}, "Invalid hydra.sweeper.n_jobs='four': must be a whole number"),
        ({"n_jobs": True}, "Invalid hydra.sweeper.n_jobs=True: must be a whole number"),
        ({"max_failure_rate": 1.5}, "Invalid hydra.sweeper.max_failure_rate=1.5"),
        ({"monitor": ""}, "Invalid hydra.sweeper.monitor=''"),
        ({"custom_search_space": "no_such_module.configure"}, "takes (cfg, trial)"),
        ({"max_resamples": 0}, "Invalid hydra.sweeper.max_resamples=0"),
        ({"study_name": ""}, "Invalid hydra.sweeper.study_name=''"),
        ({"metric_names": ["a", "b"]}, "names 2 values, but the study has 1 direction(s)"),
        ({"metric_names": [1]}, "Invalid hydra.sweeper.metric_names=[1]: must be names"),
        (
            {"metric_names": ["loss", "loss"], "direction": ["minimize", "maximize"]},
            "names a value twice",
        ),
    ],
)
def test_bad_option_values_are_named_with_their_fix(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, **options})
    assert expected in str(raised.value)
    assert "Fix: " in str(raised.value)


def test_a_storage_that_is_not_a_url_is_named_with_its_fix() -> None:
    # the CLI cases above show such an error stopping the sweep before any trial
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage": "optuna.db"})
    message = str(raised.value)
    assert "Invalid hydra.sweeper.storage='optuna.db'" in message
    assert "sqlite:///optuna.db" in message
    # what Hydra prints as a compact message, not a stack trace
    assert isinstance(raised.value, CompactHydraException)


@pytest.mark.parametrize("value", ["10.0.0.5:http", "10.0.0.5:70000", ":13000", "a/b:1", 13000])
def test_a_bad_storage_proxy_address_is_named_with_its_fix(value: object) -> None:
    with pytest.raises(OptionError) as raised:
        parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage_proxy": value})
    message = str(raised.value)
    assert f"Invalid hydra.sweeper.storage_proxy={value!r}" in message
    assert "HOST:PORT" in message and "Fix: set e.g. hydra.sweeper.storage_proxy=" in message


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("10.0.0.5:13000", ("10.0.0.5", 13000)),
        ("10.0.0.5", ("10.0.0.5", 0)),
        ("[::1]:9", ("::1", 9)),
    ],
)
def test_a_storage_proxy_address_is_host_and_port(value: str, parsed: tuple[str, int]) -> None:
    options = parse_optuna_sweeper_options({"pruner": {"name": "none"}, "storage_proxy": value})
    assert options.storage_proxy == parsed


def parse_tls(cert: object, key: object) -> Any:
    return parse_optuna_sweeper_options(
        {"pruner": {"name": "none"}, "storage_proxy_tls_cert": cert, "storage_proxy_tls_key": key}
    )


def tls_refused(cert: object, key: object) -> str:
    """The error that refuses the pair: its text."""
    with pytest.raises(OptionError) as raised:
        parse_tls(cert, key)
    return str(raised.value)


@pytest.mark.parametrize(
    "cert, key, named, problem",
    [
        ("proxy.crt", None, KEY, f"Invalid {KEY}=None: is unset while {CERT} is set: TLS"),
        (None, "proxy.key", CERT, f"Invalid {CERT}=None: is unset while {KEY} is set: TLS"),
        ("", "proxy.key", CERT, f"Invalid {CERT}='': must be the path of a PEM file"),
    ],
)
def test_a_proxy_certificate_without_its_key_is_named_with_its_fix(
    cert: object, key: object, named: str, problem: str
) -> None:
    with pytest.raises(OptionError) as raised:
        parse_tls(cert, key)
    assert raised.value.key == named
    message = str(raised.value)
    assert problem in message
    assert f"Fix: set both {CERT}=PATH and {KEY}=PATH" in message
    assert "openssl req -x509" in message and "or neither, for no TLS" in message


def test_an_unreadable_proxy_certificate_or_key_is_named(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "proxy")
    missing = str(tmp_path / "missing.crt")
    with pytest.raises(OptionError) as raised:
        parse_tls(missing, str(key))
    assert f"Invalid {CERT}='{missing}': cannot be read (No such file or directory)" in str(
        raised.value
    )
    with pytest.raises(OptionError) as raised:
        parse_tls(str(cert), str(tmp_path))  # a directory
    assert f"Invalid {KEY}='{tmp_path}': cannot be read (Is a directory)" in str(raised.value)


def test_a_proxy_certificate_that_is_not_its_keys_is_named(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "proxy")
    _, other_key = self_signed(tmp_path, "other")
    message = tls_refused(str(cert), str(other_key))
    assert f"Invalid {CERT}='{cert}': and {KEY}='{other_key}' are not a PEM certificate" in message
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a certificate\n")
    with pytest.raises(OptionError) as raised:
        parse_tls(str(garbage), str(key))
    assert "are not a PEM certificate and its key" in str(raised.value)


def test_a_proxy_certificate_file_holding_the_key_is_refused(tmp_path: Path) -> None:
    # its text goes to every job: a private key in it would go too
    cert, key = self_signed(tmp_path, "proxy")
    both = tmp_path / "both.pem"
    both.write_bytes(cert.read_bytes() + key.read_bytes())
    message = tls_refused(str(both), str(key))
    assert f"Invalid {CERT}='{both}': holds a private key" in message
    assert f"Fix: give the certificate alone in {CERT}" in message


def test_an_encrypted_proxy_key_is_named_with_how_to_decrypt_it(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    cert, key = self_signed(tmp_path, "proxy")
    plain = serialization.load_pem_private_key(key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        plain.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    message = tls_refused(str(cert), str(encrypted))  # and no password prompt on the terminal
    assert f"Invalid {KEY}='{encrypted}': is encrypted" in message
    assert f"Fix: decrypt it (openssl pkey -in {encrypted} -out proxy.key)" in message


def test_a_proxy_certificate_and_its_key_are_read_for_the_sweep(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "proxy")
    tls = parse_tls(str(cert), str(key)).storage_proxy_tls
    assert (tls.cert_pem, tls.key_pem) == (cert.read_bytes(), key.read_bytes())
    assert "PRIVATE" not in repr(tls)  # the options may be logged; the key must not be
    assert parse_tls(None, None).storage_proxy_tls is None  # the default: no TLS


@pytest.mark.parametrize(
    "options, key, fix",
    [
        (
            {"search_space": {"x": {"type": "float", "low": 0, "high": 1, "q": 0.1}}},
            "hydra.sweeper.search_space.x",
            "use only type, low, high, step, log, choices",
        ),
        (
            {"search_space": {"x": {"type": "uniform", "low": 0, "high": 1}}},
            "hydra.sweeper.search_space.x",
            "write e.g. {type: float, low: 0.0, high: 1.0}",
        ),
        (
            {"search_space": {"x": {"type": "int", "low": 8, "high": 1}}},
            "hydra.sweeper.search_space.x",
            "write e.g. {type: int, low: 1, high: 100}",
        ),
        (
            {"search_space": {"x": {"type": "categorical", "choices": []}}},
            "hydra.sweeper.search_space.x",
            "write {type: categorical, choices: [a, b]}",
        ),
    ],
)
def test_a_bad_search_space_is_named_with_its_value_and_fix(
    options: dict[str, Any], key: str, fix: str
) -> None:
    with pytest.raises(OptionError) as raised:
        FurcateOptunaSweeper.parse_options({"pruner": {"name": "none"}, **options})
    error = raised.value
    assert error.key == key
    name = key.rpartition("search_space")[2].lstrip(".")
    value = options["search_space"][name] if name else options["search_space"]
    assert f"Invalid {key}={value!r}: " in str(error)
    assert f"Fix: {fix}" in str(error)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["returns=2"],
            "returned (1.0, -1.0) (2 values), but hydra.sweeper.direction is ['minimize'] "
            "(1 value). Fix: return a number (the value to minimize)",
        ),
        # the same check on other values: CI runs them, the quick suite one
        pytest.param(
            ["hydra.sweeper.direction=[minimize,maximize]"],
            "returned 1.0 (1 value), but hydra.sweeper.direction is ['minimize', 'maximize'] "
            "(2 values). Fix: return a tuple of 2 numbers, one per direction",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["returns=none"],
            "returned None, which is not a number. Fix: return a number",
            marks=pytest.mark.slow,
        ),
    ],
)
@pytest.mark.usefixtures("mlflow_store")
def test_a_task_returning_the_wrong_values_fails_its_trial_with_a_clear_error(
    tmp_path: Path, overrides: list[str], expected: str
) -> None:
    # x=0 y=0 gives 1.0; n_jobs=1 so the first failure is the only trial
    fixed = ["hydra.sweeper.params.x=0", "hydra.sweeper.params.y=0", "hydra.sweeper.n_jobs=1"]
    result = run_study(tmp_path, *fixed, *overrides)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    study = optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    (trial,) = study.trials
    assert trial.state is TrialState.FAIL
    assert expected.split(" (")[0] in trial.user_attrs["furcate_error"]


def test_a_study_keeps_its_directions(tmp_path: Path, run_study_in_process: RunStudy) -> None:
    # the study, in this process (raises where the CLI would fail); the CLI run below reopens it
    run_study_in_process("hydra.sweeper.n_trials=2")
    again = run_study(tmp_path, "hydra.sweeper.direction=maximize", sweep="again")
    assert again.returncode != 0
    assert "Invalid hydra.sweeper.direction=['maximize']" in again.stderr
    assert "hydra.sweeper.study_name=<new name>" in again.stderr
    study = optuna.load_study(study_name="optuna_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2  # nothing lost
