"""Each private name of Optuna and Hydra that furcate reads, through its one adapter: these
fail, naming the name, when a release moves it."""

from __future__ import annotations

import socket
from typing import Any

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from furcate_hydra.hydra_api import private_names as hydra_private
from furcate_hydra.tuning import optuna_private


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=optuna.storages.InMemoryStorage())


def test_optuna_study_storage(study: optuna.Study) -> None:
    trial = study.ask()
    assert optuna_private.storage_of(study) is trial.storage  # Trial.storage is public


def test_optuna_trial_id_of_a_live_and_a_frozen_trial(study: optuna.Study) -> None:
    study.ask()
    trial = study.ask()
    storage = trial.storage
    public = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), trial.number
    )
    assert optuna_private.trial_id(trial) == public
    frozen = study.get_trials(deepcopy=False)[1]
    assert optuna_private.trial_id(frozen) == public


def test_optuna_grpc_servicer() -> None:
    pytest.importorskip("grpc")
    add_servicer, servicer = optuna_private.grpc_servicer()
    assert callable(add_servicer) and callable(servicer)


def test_optuna_asked_trial_is_sampled_as_ask_samples(study: optuna.Study) -> None:
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    storage = optuna_private.storage_of(study)
    study_id = storage.get_study_id_from_name(study.study_name)
    created = storage.create_new_trial(study_id)
    trial = optuna_private.asked(study, created, space)
    assert optuna_private.trial_id(trial) == created
    assert 0.0 <= trial.params["x"] <= 1.0
    assert study.trials[trial.number].distributions == space  # stored as ask stores it


def test_optuna_grpc_proxy_calls_through_a_channel_of_ours() -> None:
    pytest.importorskip("grpc")
    import grpc

    methods: list[str] = []

    class Recording(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            methods.append(details.method.rsplit("/", 1)[-1])
            return continuation(details, request)

    with socket.socket() as closed:  # bound, not listening: every call is refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        channel = grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), Recording())
        proxy = optuna_private.grpc_proxy_over(channel, "127.0.0.1", port)
        for call in (lambda: proxy.get_study_id_from_name("s"), lambda: proxy.get_all_trials(0)):
            with pytest.raises(grpc.RpcError):
                call()
        proxy.close()
    # the stub's calls and the trial cache's both went through it
    assert methods == ["GetStudyIdFromName", "GetTrials"]


@pytest.mark.parametrize(
    "read, obj, name",
    [
        (optuna_private.storage_of, object(), "Study._storage"),
        (optuna_private.trial_id, object(), "object._trial_id"),
        (lambda obj: optuna_private.asked(obj, 0, {}), object(), "Study._thread_local"),
    ],
)
def test_a_moved_optuna_name_is_named_with_the_versions(read: Any, obj: object, name: str) -> None:
    with pytest.raises(optuna_private.OptunaPrivateMoved) as raised:
        read(obj)
    message = str(raised.value)
    assert f"Optuna's private {name}, which optuna {optuna.__version__} no longer has" in message
    assert f"read from optuna {optuna_private.TESTED}" in message and "Fix:" in message


def test_hydra_job_return_value_of_a_failed_job_read_without_raising(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = ValueError("boom")
    failed = JobReturn(status=JobStatus.FAILED, _return_value=error)
    assert hydra_private.returned(failed) is error
    assert capsys.readouterr().err == ""  # JobReturn.return_value would print and raise
    completed = JobReturn(status=JobStatus.COMPLETED)
    completed.return_value = 0.5  # the public setter writes what the adapter reads
    assert hydra_private.returned(completed) == 0.5 == completed.return_value


def test_hydra_apply_overrides_and_the_override_dirname() -> None:
    config = OmegaConf.create({"lr": 0.1, "model": {"depth": 2}})
    parsed = OverridesParser.create().parse_overrides(["lr=0.01", "model.depth=4"])
    hydra_private.apply_overrides(parsed, config)
    assert OmegaConf.to_container(config) == {"lr": 0.01, "model": {"depth": 4}}
    assert hydra_private.get_overrides_dirname(parsed, [], ",", "=") == "lr=0.01,model.depth=4"


def test_hydra_callbacks_run_what_run_job_calls() -> None:
    for hook in ("on_job_start", "on_job_end"):
        assert callable(getattr(hydra_private.Callbacks, hook))


def test_a_moved_hydra_name_is_named_with_the_versions() -> None:
    with pytest.raises(hydra_private.HydraPrivateMoved) as raised:
        hydra_private.returned(object())  # type: ignore[arg-type]
    message = str(raised.value)
    assert "Hydra's private JobReturn._return_value, which hydra-core" in message
    assert f"read from hydra-core {hydra_private.TESTED}" in message and "Fix:" in message


def test_hydra_args_parser_reads_the_primary_config_flags() -> None:
    args = hydra_private.get_args_parser().parse_args(["-m", "-cn", "a", "--config-dir=b", "x=1"])
    assert (args.config_name, args.config_dir, args.config_path) == ("a", "b", None)
    assert args.multirun and args.overrides == ["x=1"]
