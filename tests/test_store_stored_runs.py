"""stored_runs (furcate status's SELECTs) reads what MLflow's search_runs reads, on a real store."""

from __future__ import annotations

import math
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from furcate_hydra.store import Tags
from furcate_hydra.store.stored_runs import has_database, stored_runs


def _store(tmp_path: Path) -> tuple[MlflowClient, str, str, list[str]]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("e")
    sweep = client.create_run(experiment, tags={Tags.ROLE: "sweep"}).info.run_id
    other = client.create_run(experiment).info.run_id
    children = []
    for i in range(7):
        parent = sweep if i != 6 else other
        run = client.create_run(
            experiment,
            start_time=1_000 + i * (-1) ** i,  # not in creation order
            tags={Tags.PARENT_RUN: parent, Tags.FINGERPRINT: f"fp{i}", Tags.JOB_NUM: str(i)},
        )
        run_id = run.info.run_id
        client.log_param(run_id, "lr", str(i))
        metrics = [Metric("loss", 1.0 / (i + 1), 0, 0), Metric("loss", 0.5 / (i + 1), 0, 1)]
        if i == 2:
            metrics.append(Metric("acc", math.nan, 0, 0))
        client.log_batch(run_id, metrics=metrics)
        if i % 3 == 0:
            client.set_terminated(run_id, "FAILED", end_time=5_000 + i)
        children.append(run_id)
    client.delete_run(children[5])
    return client, experiment, sweep, children


def test_children_of_a_sweep_as_search_runs_reads_them(tmp_path: Path) -> None:
    client, experiment, sweep, _ = _store(tmp_path)
    assert has_database(client)
    searched = client.search_runs([experiment], f"tags.`{Tags.PARENT_RUN}` = '{sweep}'")
    read = stored_runs(client, experiment, parent_run_id=sweep)
    # the deleted run and the other sweep's run are left out, the order is search_runs'
    assert [r.record.run_id for r in read] == [r.info.run_id for r in searched]
    assert len(read) == 5
    for run, mine in zip(searched, read, strict=True):
        assert mine.record.status.value == run.info.status
        assert mine.record.start_time_ms == run.info.start_time
        assert mine.end_time_ms == run.info.end_time
        assert mine.record.tags == run.data.tags
        assert mine.record.fingerprint == run.data.tags[Tags.FINGERPRINT]
        assert mine.metrics.keys() == run.data.metrics.keys()
        for key, value in run.data.metrics.items():
            assert (
                math.isnan(value) if math.isnan(mine.metrics[key]) else mine.metrics[key] == value
            )


def test_runs_by_id(tmp_path: Path) -> None:
    client, experiment, _, children = _store(tmp_path)
    read = stored_runs(client, experiment, run_ids=[children[6], children[1], children[5]])
    assert {r.record.run_id for r in read} == {children[6], children[1]}  # 5 is deleted
    assert stored_runs(client, "999", run_ids=children) == []
