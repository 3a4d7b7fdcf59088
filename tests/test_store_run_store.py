"""The launcher's connection to MLflow, against a real sqlite store: sweeps, job runs, decisions."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.store import (
    Action,
    ClaimRequest,
    LauncherIdentity,
    Rerun,
    RunStatus,
    RunStore,
    Tags,
    resolve_tracking_uri,
)
from furcate_hydra.store.run_record import MAX_TAG_VALUE, RETURN_VALUE_ARTIFACT
from furcate_hydra.store.run_store import EXPERIMENT_KIND, MODEL_TRAINING
from tests.store_helpers import artifact_names, exited_launcher

HEARTBEAT_S = 0.2


def open_store(uri: str, name: str = "exp") -> RunStore:
    return RunStore(
        resolve_tracking_uri(uri), name, heartbeat_s=HEARTBEAT_S, stale_after_s=5, sqlite_wal=True
    )


@pytest.fixture
def store(mlflow_store: str) -> Iterator[RunStore]:
    opened = open_store(mlflow_store)
    try:
        yield opened
    finally:
        opened.close()


def job_tags(fingerprint: str, num: int = 0) -> dict[str, str]:
    return {Tags.FINGERPRINT: fingerprint, Tags.JOB_NUM: str(num), Tags.OUTPUT_DIR: f"/o/{num}"}


def new_run(
    store: RunStore, name: str, tags: dict[str, str], params: dict[str, str] | None = None
) -> str:
    """A job's new run, as the launcher opens it: claimed, checked, confirmed."""
    (claim,) = store.claim([ClaimRequest(tags[Tags.FINGERPRINT], name, tags, params or {})])
    assert claim.won
    return store.confirm(claim)


def heartbeat(store: RunStore, run_id: str) -> float:
    return float(store.client.get_run(run_id).data.tags[Tags.HEARTBEAT])


def test_a_sweep_is_a_running_parent_run_with_a_heartbeat(store: RunStore, tmp_path: Path) -> None:
    before = time.time()
    sweep_id = store.start_sweep("sweep multirun/a", {Tags.SWEEP_DIR: "/sweeps/a"})
    run = store.client.get_run(sweep_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "sweep multirun/a"
    assert run.info.experiment_id == store.experiment_id
    tags = run.data.tags
    assert tags[Tags.ROLE] == "sweep" and tags[Tags.SWEEP_DIR] == "/sweeps/a"
    assert LauncherIdentity.current().tags().items() <= tags.items()
    first = heartbeat(store, sweep_id)
    assert before - 0.01 <= first <= time.time()
    deadline = time.monotonic() + 5
    while heartbeat(store, sweep_id) == first and time.monotonic() < deadline:
        time.sleep(HEARTBEAT_S / 2)
    assert heartbeat(store, sweep_id) >= first + HEARTBEAT_S

    summary = tmp_path / "run_data.csv"
    summary.write_text("job_num\n")
    store.finish_sweep(RunStatus.FAILED, [summary, tmp_path / "missing.csv"])
    run = store.client.get_run(sweep_id)
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert artifact_names(store.tracking_uri, sweep_id) == {"run_data.csv"}
    assert store.sweep_run_id is None
    # The heartbeat thread stops with the sweep: the tag no longer moves.
    assert store._heartbeat is not None
    store._heartbeat.join(timeout=2 * HEARTBEAT_S + 1)
    assert not store._heartbeat.is_alive()
    last = heartbeat(store, sweep_id)
    time.sleep(2 * HEARTBEAT_S)
    assert heartbeat(store, sweep_id) == last


def test_sweeps_whose_launcher_is_gone_are_ended_killed(mlflow_store: str) -> None:
    store = open_store(mlflow_store)
    client, exp = store.client, store.experiment_id
    now = time.time()

    def sweep(identity: LauncherIdentity, beat: float) -> str:
        tags = {**identity.tags(), Tags.ROLE: "sweep", Tags.HEARTBEAT: f"{beat:.3f}"}
        run_id: str = client.create_run(exp, tags=tags).info.run_id
        return run_id

    remote = replace(LauncherIdentity.current(), host="another-host", pid=1, started="1")
    killed_here = sweep(exited_launcher(), now - 30)
    alive_here = sweep(LauncherIdentity.current(), now - 30)
    stale_remote = sweep(remote, now - 600)
    fresh_remote = sweep(remote, now)
    job = client.create_run(exp, tags={**exited_launcher().tags(), Tags.FINGERPRINT: "fp"})
    try:
        own = store.start_sweep("sweep now", {})
        status = {r: client.get_run(r).info.status for r in (killed_here, stale_remote)}
        assert status == {killed_here: "KILLED", stale_remote: "KILLED"}
        ended = client.get_run(killed_here)
        last_beat = float(f"{now - 30:.3f}")
        assert ended.info.end_time == int(last_beat * 1000)  # when it was last known alive
        assert "has exited" in ended.data.tags[Tags.ERROR]
        assert "heartbeat 600 s ago" in client.get_run(stale_remote).data.tags[Tags.ERROR]
        for running in (alive_here, fresh_remote, own, job.info.run_id):
            assert client.get_run(running).info.status == "RUNNING"
    finally:
        store.close()


def test_finish_sweep_without_a_sweep_does_nothing(store: RunStore) -> None:
    store.finish_sweep(RunStatus.FINISHED)
    assert store.client.search_runs([store.experiment_id]) == []


def test_a_job_run_is_a_running_child_with_its_config_as_params(store: RunStore) -> None:
    sweep_id = store.start_sweep("sweep", {})
    # More params than one MLflow batch holds (100): every one of them must land.
    params = {f"model.layer_{i:03d}.width": str(i) for i in range(250)}
    run_id = new_run(store, "+lr=0.1", job_tags("fp-1", 3), params)
    run = store.client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "+lr=0.1"
    assert run.data.params == params
    tags = run.data.tags
    assert tags[Tags.PARENT_RUN] == sweep_id
    assert tags[Tags.FINGERPRINT] == "fp-1" and tags[Tags.JOB_NUM] == "3"
    assert Tags.CLAIM not in tags  # its logged params say that its launcher won the claim
    assert LauncherIdentity.current().tags().items() <= tags.items()


def test_a_finished_job_records_its_value_artifacts_and_end(
    store: RunStore, tmp_path: Path
) -> None:
    store.start_sweep("sweep", {})
    (tmp_path / "stdout.log").write_text("hello\n")
    (tmp_path / "stderr.log").write_text("")
    run_id = new_run(store, "job", job_tags("fp"), {"lr": "0.1"})
    end = time.time() - 3
    store.finish_job_run(
        run_id,
        RunStatus.FINISHED,
        return_value=0.25,
        artifacts=[tmp_path / "stdout.log", tmp_path / "stderr.log", tmp_path / "absent.json"],
        end_time=end,
    )
    run = store.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == int(end * 1000)
    assert run.data.tags[Tags.RETURN_VALUE] == "json:0.25"
    # The value is a tag only: the task's own metrics (val_acc…) are what the UI compares.
    assert run.data.metrics == {}
    assert Tags.ERROR not in run.data.tags
    assert artifact_names(store.tracking_uri, run_id) == {"stdout.log", "stderr.log"}
    local = Path(store.client.download_artifacts(run_id, "stdout.log", str(tmp_path / "dl")))
    assert local.read_text() == "hello\n"


@pytest.mark.parametrize("value", [{"loss": 0.5}, True, "done", None])
def test_any_json_value_is_recorded_as_json(store: RunStore, value: Any) -> None:
    run_id = new_run(store, "job", job_tags("fp"), {})
    store.finish_job_run(run_id, RunStatus.FINISHED, return_value=value)
    run = store.client.get_run(run_id)
    assert run.data.tags[Tags.RETURN_VALUE].startswith("json:")
    assert (
        store.recorded_return_value(
            store.decide(["fp"], Rerun.FAILED)["fp"].record  # type: ignore[arg-type]
        )
        == value
    )


def test_a_failed_job_keeps_the_end_of_its_error(store: RunStore) -> None:
    run_id = new_run(store, "job", job_tags("fp"), {})
    error = "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "ValueError: bad lr"
    store.finish_job_run(run_id, RunStatus.FAILED, return_value=1.0, error=error)
    run = store.client.get_run(run_id)
    assert run.info.status == "FAILED"
    recorded = run.data.tags[Tags.ERROR]
    assert len(recorded) <= MAX_TAG_VALUE and recorded.endswith("ValueError: bad lr")
    assert Tags.RETURN_VALUE not in run.data.tags and run.data.metrics == {}


def test_a_return_value_too_large_for_a_tag_comes_back_from_an_artifact(store: RunStore) -> None:
    value = {"history": [float(i) for i in range(3000)], "shape": (3000,)}
    run_id = new_run(store, "job", job_tags("fp-big"), {})
    store.finish_job_run(run_id, RunStatus.FINISHED, return_value=value)
    run = store.client.get_run(run_id)
    assert run.data.tags[Tags.RETURN_VALUE] == "artifact:" + RETURN_VALUE_ARTIFACT
    assert artifact_names(store.tracking_uri, run_id, "furcate") == {RETURN_VALUE_ARTIFACT}
    decision = store.decide(["fp-big"], Rerun.FAILED)["fp-big"]
    assert decision.action is Action.SKIP and decision.record is not None
    recorded = store.recorded_return_value(decision.record)
    assert recorded == value and type(recorded["shape"]) is tuple


def test_recorded_return_values_decode_from_the_tag(store: RunStore) -> None:
    for fp, value in [("fp-json", [1, 2]), ("fp-pickle", (1, 2)), ("fp-none", None)]:
        run_id = new_run(store, "job", job_tags(fp), {})
        store.finish_job_run(run_id, RunStatus.FINISHED, return_value=value)
        record = store.decide([fp], Rerun.FAILED)[fp].record
        assert record is not None
        recorded = store.recorded_return_value(record)
        assert recorded == value and type(recorded) is type(value)


def test_one_decide_call_sorts_a_mixed_batch(store: RunStore) -> None:
    sweep_id = store.start_sweep("sweep", {})
    client, exp = store.client, store.experiment_id

    def ended(fp: str, status: RunStatus) -> str:
        run_id = new_run(store, fp, job_tags(fp), {})
        store.finish_job_run(run_id, status, return_value="v")
        return run_id

    def running(fp: str, identity: LauncherIdentity, parent: str) -> str:
        tags = {**job_tags(fp), **identity.tags(), Tags.PARENT_RUN: parent}
        run_id: str = client.create_run(exp, tags=tags).info.run_id
        return run_id

    remote = replace(LauncherIdentity.current(), host="another-host", pid=1, started="1")
    stale_sweep = client.create_run(
        exp, tags={Tags.ROLE: "sweep", Tags.HEARTBEAT: f"{time.time() - 60:.3f}"}
    ).info.run_id
    expected = {
        "new": (Action.RUN, None),
        "finished": (Action.SKIP, ended("finished", RunStatus.FINISHED)),
        "failed": (Action.RUN, ended("failed", RunStatus.FAILED)),
        "killed": (Action.RESUME, ended("killed", RunStatus.KILLED)),
        "interrupted": (Action.RESUME, running("interrupted", exited_launcher(), sweep_id)),
        "live": (Action.ELSEWHERE, new_run(store, "live", job_tags("live"), {})),
        "remote-alive": (Action.ELSEWHERE, running("remote-alive", remote, sweep_id)),
        "remote-stale": (Action.RESUME, running("remote-stale", remote, stale_sweep)),
        "remote-orphan": (Action.RESUME, running("remote-orphan", remote, "no-such-run")),
    }
    decisions = store.decide(expected, Rerun.FAILED)
    got = {fp: (d.action, d.record.run_id if d.record else None) for fp, d in decisions.items()}
    assert got == expected
    assert decisions["interrupted"].reason.startswith("interrupted: its launcher (pid ")
    # 60 s old when written; a second or two more by the time a loaded machine decides
    assert re.search(r"heartbeat 6\d s ago", decisions["remote-stale"].reason)
    assert "never sent a heartbeat" in decisions["remote-orphan"].reason

    none = store.decide(expected, Rerun.NONE)
    assert none["killed"].action is Action.REPORT_FAILURE
    assert none["failed"].action is Action.REPORT_FAILURE
    assert none["interrupted"].action is Action.RESUME
    every = store.decide(expected, Rerun.ALL)
    held = {fp for fp, d in every.items() if d.action is Action.ELSEWHERE}
    assert held == {"live", "remote-alive"}
    assert {d.action for fp, d in every.items() if fp not in held} == {Action.RUN}


def test_a_resumed_run_is_running_again_and_counts_its_resumes(store: RunStore) -> None:
    store.start_sweep("first", {})
    run_id = new_run(store, "job", job_tags("fp"), {"lr": "0.1"})
    for resumes in (1, 2):
        store.finish_job_run(run_id, RunStatus.KILLED, error="launcher stopped")
        decision = store.decide(["fp"], Rerun.FAILED)["fp"]
        assert decision.action is Action.RESUME and decision.record is not None
        assert decision.record.run_id == run_id
        tags = {**job_tags("fp", 7), Tags.CHECKPOINT_DIR: "/o/7/checkpoints"}
        (claim,) = store.claim([ClaimRequest("fp", "job", tags, {}, decision.record)])
        assert claim.won and claim.run.run_id != run_id  # a stand-in claims the run
        assert store.confirm(claim) == run_id
        # the stand-in is gone: the resumed run is the config's only active run
        assert store.client.get_run(claim.run.run_id).info.lifecycle_stage == "deleted"
        run = store.client.get_run(run_id)
        assert run.info.status == "RUNNING"
        assert run.data.tags[Tags.RESUMED] == str(resumes)
        assert run.data.tags[Tags.JOB_NUM] == "7"
        assert run.data.tags[Tags.CHECKPOINT_DIR] == "/o/7/checkpoints"
        assert run.data.tags[Tags.PARENT_RUN] == store.sweep_run_id
    store.finish_job_run(run_id, RunStatus.FINISHED, return_value=1)
    assert store.client.get_run(run_id).info.status == "FINISHED"
    assert store.decide(["fp"], Rerun.FAILED)["fp"].action is Action.SKIP


def test_latest_metrics_of_several_runs(store: RunStore) -> None:
    first = new_run(store, "a", job_tags("a"), {})
    second = new_run(store, "b", job_tags("b"), {})
    for step, loss in enumerate([0.9, 0.5]):
        store.client.log_metric(first, "loss", loss, step=step)
    store.client.log_metric(second, "acc", 0.75)
    new_run(store, "c", job_tags("c"), {})
    assert store.latest_metrics([first, second]) == {
        first: {"loss": 0.5},
        second: {"acc": 0.75},
    }
    assert store.latest_metrics([]) == {}


def test_a_deleted_experiment_of_the_same_name_is_restored(mlflow_store: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_store)
    exp_id = client.create_experiment("study")
    client.delete_experiment(exp_id)
    reopened = open_store(mlflow_store, "study")
    reopened.close()
    assert reopened.experiment_id == exp_id
    assert client.get_experiment(exp_id).lifecycle_stage == "active"


def test_experiments_are_marked_as_holding_model_training_runs(mlflow_store: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_store)
    opened = open_store(mlflow_store, "new")
    opened.close()
    assert client.get_experiment(opened.experiment_id).tags[EXPERIMENT_KIND] == MODEL_TRAINING
    # one made before the mark (by hand, or by an older furcate) gets it when a sweep opens it
    older = client.create_experiment("older")
    open_store(mlflow_store, "older").close()
    assert client.get_experiment(older).tags[EXPERIMENT_KIND] == MODEL_TRAINING
    # a kind someone chose stays
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND: "genai_development"})
    open_store(mlflow_store, "chosen").close()
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND] == "genai_development"


def test_artifacts_live_next_to_the_sqlite_file(
    mlflow_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the launcher happens to run
    opened = open_store(mlflow_store, "near")
    opened.close()
    experiment = opened.client.get_experiment(opened.experiment_id)
    assert experiment.artifact_location == str(tmp_path / "mlruns")
    log = tmp_path / "stdout.log"
    log.write_text("x")
    run_id = new_run(opened, "job", job_tags("fp"), {})
    opened.finish_job_run(run_id, RunStatus.FINISHED, artifacts=[log])
    artifact_uri = opened.client.get_run(run_id).info.artifact_uri
    assert artifact_uri.startswith(f"{tmp_path}/mlruns/")
    assert (Path(artifact_uri) / "stdout.log").read_text() == "x"
    assert list(elsewhere.iterdir()) == []
    # An experiment that already exists keeps its location; opening it again finds it.
    assert open_store(mlflow_store, "near").experiment_id == opened.experiment_id
