"""The experiment's memory of what an app's jobs import (``store.app_imports``), on a real store."""

from __future__ import annotations

import json
import logging

import pytest
from mlflow.tracking import MlflowClient

from furcate_hydra.store.app_imports import PRELOAD_TAG, remember_imports, remembered_imports


def _remembered(client: MlflowClient, experiment_id: str) -> list[str]:
    return remembered_imports(client.get_experiment(experiment_id).tags)


@pytest.fixture
def experiment(mlflow_store: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(mlflow_store)
    return client, client.create_experiment("app")


def test_what_is_remembered_is_read_back_in_order_and_only_added_to(
    experiment: tuple[MlflowClient, str],
) -> None:
    client, experiment_id = experiment
    assert _remembered(client, experiment_id) == []
    remember_imports(client, experiment_id, ["torch", "lightning"], [])
    known = _remembered(client, experiment_id)
    assert known == ["torch", "lightning"]
    remember_imports(client, experiment_id, ["lightning", "mlflow"], known)
    assert _remembered(client, experiment_id) == ["torch", "lightning", "mlflow"]


def test_a_damaged_tag_is_said_and_preloads_nothing_then_is_written_again(
    experiment: tuple[MlflowClient, str], caplog: pytest.LogCaptureFixture
) -> None:
    client, experiment_id = experiment
    client.set_experiment_tag(experiment_id, PRELOAD_TAG, "torch, lightning")
    with caplog.at_level(logging.WARNING):
        known = _remembered(client, experiment_id)
    assert known == []
    warning = caplog.records[-1].getMessage()
    assert PRELOAD_TAG in warning and "'torch, lightning'" in warning
    assert "not a list of module names" in warning
    remember_imports(client, experiment_id, ["torch"], known)
    tag = client.get_experiment(experiment_id).tags[PRELOAD_TAG]
    assert json.loads(tag) == ["torch"]
