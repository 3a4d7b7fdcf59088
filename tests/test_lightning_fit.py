"""fit() bound to a real MLflow run (sqlite store in tmp_path), and JobEnv."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.layout import JobPaths

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

ALL_VARS = (
    env_vars.TRACKING_URI,
    env_vars.RUN_ID,
    env_vars.EXPERIMENT_ID,
    env_vars.OUTPUT_DIR,
    env_vars.CHECKPOINT_DIR,
)


@dataclass(frozen=True)
class Store:
    uri: str
    client: MlflowClient
    experiment_id: str


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One sqlite store for the module: creating one runs the migrations (~1.5 s)."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("jobs", artifact_location=(root / "art").as_uri())
    return Store(uri, client, experiment_id)


@pytest.fixture
def launched(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path]]:
    """What the launcher does before starting a job: a RUNNING run with the config as params."""
    run_id = store.client.create_run(store.experiment_id).info.run_id
    store.client.log_param(run_id, "learning_rate", "0.05")  # the model's value too
    store.client.log_param(run_id, "hidden", "999")  # the model says 8: a conflict
    out = tmp_path / "job"
    for name, value in (
        (env_vars.TRACKING_URI, store.uri),
        (env_vars.RUN_ID, run_id),
        (env_vars.EXPERIMENT_ID, store.experiment_id),
        (env_vars.OUTPUT_DIR, str(out)),
        (env_vars.CHECKPOINT_DIR, str(tmp_path / "ckpt")),
    ):
        monkeypatch.setenv(name, value)
    yield run_id, out


def test_fit_records_into_the_launchers_run_and_leaves_it_running(
    store: Store, launched: tuple[str, Path]
) -> None:
    from mlflow.entities import RunStatus

    from furcate_hydra.lightning import JobEnv
    from tests.lightning_helpers import run_fit

    run_id, out = launched
    runs_before = len(store.client.search_runs([store.experiment_id]))

    _, result = run_fit(JobEnv.from_environ(), max_epochs=3)

    run = store.client.get_run(run_id)
    assert run.info.status == RunStatus.to_string(RunStatus.RUNNING)
    # existing params untouched (the conflicting one silently kept), missing ones added
    assert run.data.params["learning_rate"] == "0.05"
    assert run.data.params["hidden"] == "999"
    assert run.data.params["tag"] == "tiny"
    assert len(store.client.search_runs([store.experiment_id])) == runs_before

    val_loss = store.client.get_metric_history(run_id, "val_loss")
    history = json.loads((out / "history.json").read_text())
    # Lightning logs epoch-end metrics at global_step - 1, the step of the epoch's last batch
    assert [m.step for m in val_loss] == [row["step"] - 1 for row in history]
    assert len(store.client.get_metric_history(run_id, "train_loss_epoch")) == 3

    artifacts = {a.path for a in store.client.list_artifacts(run_id)}
    assert artifacts == {"history.json", "plots", "checkpoints"}
    plots = {a.path for a in store.client.list_artifacts(run_id, "plots")}
    assert plots == {"plots/loss.png", "plots/epoch_marker.png"}
    assert {a.path for a in store.client.list_artifacts(run_id, "checkpoints")} == {
        "checkpoints/final.ckpt"
    }
    assert result.checkpoint_path == out / "final.ckpt"
    assert result.metrics["val_loss"] == pytest.approx(history[-1]["val_loss"])


def test_failed_fit_leaves_the_run_to_the_launcher(
    store: Store, launched: tuple[str, Path]
) -> None:
    from mlflow.entities import RunStatus

    from furcate_hydra.lightning import JobEnv
    from tests.lightning_helpers import TinyModule, run_fit

    run_id, _ = launched
    model = TinyModule()
    model.fail_at_epoch = 1
    with pytest.raises(RuntimeError, match="planned failure"):
        run_fit(JobEnv.from_environ(), max_epochs=3, model=model)
    status = store.client.get_run(run_id).info.status
    assert status == RunStatus.to_string(RunStatus.RUNNING)


@pytest.mark.parametrize(
    ("key", "value"), [("logger", False), ("enable_checkpointing", False), ("callbacks", "x")]
)
def test_options_fit_owns_are_rejected(key: str, value: object, tmp_path: Path) -> None:
    from furcate_hydra.lightning import JobEnv, fit
    from tests.lightning_helpers import OPTIONS, TinyModule, loaders

    env = JobEnv(tmp_path, tmp_path / "checkpoints")
    with pytest.raises(FurcateConfigError, match=rf"trainer_options\.{key}="):
        fit(TinyModule(), **loaders(), trainer_options={**OPTIONS, key: value}, env=env)


def test_job_env_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from furcate_hydra.lightning import JobEnv

    monkeypatch.chdir(tmp_path)
    env = JobEnv.from_environ({})
    assert env == JobEnv(tmp_path, tmp_path / JobPaths.CHECKPOINTS, None, None, None)
    assert not env.recording

    given = JobEnv.from_environ({env_vars.OUTPUT_DIR: ""}, default_output_dir=tmp_path / "out")
    assert given.output_dir == tmp_path / "out"
    assert given.checkpoint_dir == tmp_path / "out" / JobPaths.CHECKPOINTS


def test_job_env_explicit_values(tmp_path: Path) -> None:
    from furcate_hydra.lightning import JobEnv

    env = JobEnv.from_environ(
        {
            env_vars.TRACKING_URI: "http://127.0.0.1:5000",
            env_vars.RUN_ID: "abc123",
            env_vars.EXPERIMENT_ID: "7",
            env_vars.OUTPUT_DIR: str(tmp_path / "out"),
            env_vars.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        },
        default_output_dir=tmp_path / "ignored",
    )
    assert env == JobEnv(
        tmp_path / "out", tmp_path / "ckpt", "http://127.0.0.1:5000", "abc123", "7"
    )
    assert env.recording


def test_run_id_without_tracking_uri_is_not_recording(caplog: pytest.LogCaptureFixture) -> None:
    from furcate_hydra.lightning import JobEnv

    with caplog.at_level(logging.WARNING):
        env = JobEnv.from_environ({env_vars.RUN_ID: "abc123"})
    assert not env.recording
    assert f"{env_vars.TRACKING_URI} is not" in caplog.text


def test_job_env_reads_os_environ_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from furcate_hydra.lightning import JobEnv

    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not JobEnv.from_environ().recording
    monkeypatch.setenv(env_vars.TRACKING_URI, "sqlite:////tmp/x.db")
    monkeypatch.setenv(env_vars.RUN_ID, "r1")
    assert JobEnv.from_environ().run_id == "r1"


def test_tracemalloc_top_writes_each_epochs_growth(tmp_path: Path) -> None:
    import tracemalloc

    from furcate_hydra.lightning import fit
    from tests.lightning_helpers import OPTIONS, TinyModule, loaders, run_fit, standalone_env

    env = standalone_env(tmp_path)
    options = {**OPTIONS, "max_epochs": 2}
    fit(TinyModule(), **loaders(), trainer_options=options, env=env, tracemalloc_top=3)
    text = env.paths.tracemalloc.read_text()
    epochs = [block for block in text.split("\n\n") if block.strip()]
    assert [block.split(":")[0] for block in epochs] == ["epoch 0", "epoch 1"]
    for block in epochs:
        header, *lines = block.splitlines()
        assert "Python memory traced" in header and "grew most since the" in header
        assert 1 <= len(lines) <= 3 and all(re.search(r"size=.*count=", line) for line in lines)
    assert not tracemalloc.is_tracing()  # stopped by fit, which started it
    run_fit(standalone_env(tmp_path / "off"), max_epochs=1)
    assert not (tmp_path / "off" / "out" / "tracemalloc.txt").exists()  # off by default


@pytest.mark.parametrize("top", [-1, True, 2.5, "10"])
def test_a_bad_tracemalloc_top_names_the_value_and_the_fix(top: object, tmp_path: Path) -> None:
    from furcate_hydra.lightning import JobEnv, fit
    from tests.lightning_helpers import TinyModule, loaders

    env = JobEnv(tmp_path, tmp_path / "checkpoints")
    with pytest.raises(FurcateConfigError, match=r"fit\(tracemalloc_top\)=.*tracemalloc_top=10"):
        fit(TinyModule(), **loaders(), env=env, tracemalloc_top=top)  # type: ignore[arg-type]
