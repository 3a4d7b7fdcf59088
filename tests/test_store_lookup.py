"""One lookup finds the recorded runs of a whole batch of configs, in a real sqlite store."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from furcate_hydra.sqlite_lock import creating_sqlite_schema
from furcate_hydra.store import Action, LauncherIdentity, Rerun, RunRecord, RunStatus, Tags, decide
from furcate_hydra.store.lookup import find_runs, runs_by_id
from furcate_hydra.store.sqlite_reader import SqliteReader
from tests.store_helpers import exited_launcher


class Runs:
    """Creates runs in a real MLflow store, as a launcher (or a person) would have left them."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client: Any = MlflowClient(uri)
        self.here = self.client.create_experiment("here")
        self.other = self.client.create_experiment("other")

    def add(
        self,
        fingerprint: str | None,
        start_ms: int,
        status: RunStatus = RunStatus.RUNNING,
        *,
        experiment: str | None = None,
        tags: dict[str, str] | None = None,
        deleted: bool = False,
    ) -> str:
        all_tags = dict(tags or {})
        if fingerprint is not None:
            all_tags[Tags.FINGERPRINT] = fingerprint
        run = self.client.create_run(experiment or self.here, start_time=start_ms, tags=all_tags)
        run_id: str = run.info.run_id
        if status is not RunStatus.RUNNING:
            self.client.set_terminated(run_id, status.value)
        if deleted:
            self.client.delete_run(run_id)
        return run_id


@pytest.fixture
def runs(mlflow_store: str) -> Runs:
    return Runs(mlflow_store)


class ThroughAServer:
    """The runs' client as one of an MLflow server would be: its store is a server's, with no
    database to query, so the lookup pages through ``search_runs``, which reads the same
    sqlite store here."""

    def __init__(self, client: Any) -> None:
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.utils.rest_utils import MlflowHostCreds

        self.client = client
        # never asked: a lookup that used it would fail, no server answers there
        nowhere = MlflowHostCreds("http://127.0.0.1:1")  # type: ignore[no-untyped-call]
        store = RestStore(lambda: nowhere)  # type: ignore[no-untyped-call]
        self._tracking_client = SimpleNamespace(store=store)

    def search_runs(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.search_runs(*args, **kwargs)


def flat(found: dict[str, list[RunRecord]]) -> list[RunRecord]:
    return [record for records in found.values() for record in records]


def summary(found: dict[str, list[RunRecord]]) -> dict[str, list[tuple[str, RunStatus, int]]]:
    return {
        fp: [(r.run_id, r.status, r.start_time_ms) for r in records]
        for fp, records in found.items()
    }


def test_runs_are_grouped_per_fingerprint_newest_first(runs: Runs) -> None:
    failed = runs.add("fp-a", 1000, RunStatus.FAILED)
    finished = runs.add("fp-a", 3000, RunStatus.FINISHED)
    killed = runs.add("fp-a", 2000, RunStatus.KILLED)
    runs.add("fp-a", 4000, RunStatus.FINISHED, deleted=True)  # deleted runs do not count
    elsewhere = runs.add("fp-a", 5000, RunStatus.FINISHED, experiment=runs.other)
    running = runs.add("fp-b", 1500)
    runs.add("fp-elsewhere", 1500, experiment=runs.other)
    runs.add(None, 6000, RunStatus.FINISHED)  # a run furcate did not start

    found = find_runs(runs.client, runs.here, ["fp-a", "fp-b", "fp-unknown", "fp-elsewhere"])
    assert summary(found) == {
        "fp-a": [
            (finished, RunStatus.FINISHED, 3000),
            (killed, RunStatus.KILLED, 2000),
            (failed, RunStatus.FAILED, 1000),
        ],
        "fp-b": [(running, RunStatus.RUNNING, 1500)],
    }
    assert all(r.fingerprint == fp for fp, records in found.items() for r in records)
    assert find_runs(runs.client, runs.here, []) == {}
    assert find_runs(runs.client, runs.here, {"fp-unknown"}) == {}
    assert summary(find_runs(runs.client, runs.other, ["fp-a"])) == {
        "fp-a": [(elsewhere, RunStatus.FINISHED, 5000)]
    }


def test_records_carry_furcate_tags_and_the_parent_only(runs: Runs) -> None:
    tags = {
        Tags.JOB_NUM: "3",
        Tags.OUTPUT_DIR: "/out/3",
        Tags.RETURN_VALUE: 'json:{"loss": 0.5}',
        Tags.PARENT_RUN: "parent-id",
        "user.note": "not furcate's",
        "furcatex": "a prefix without the dot",
    }
    runs.add("fp", 1000, RunStatus.FINISHED, tags=tags)
    (record,) = find_runs(runs.client, runs.here, ["fp"])["fp"]
    assert record.tags == {
        Tags.FINGERPRINT: "fp",
        Tags.JOB_NUM: "3",
        Tags.OUTPUT_DIR: "/out/3",
        Tags.RETURN_VALUE: 'json:{"loss": 0.5}',
        Tags.PARENT_RUN: "parent-id",
    }
    assert record.parent_run_id == "parent-id" and record.output_dir == "/out/3"
    assert record.has_return_value and record.checkpoint_dir is None


def test_a_lookup_larger_than_sqlites_parameter_limit_is_chunked(runs: Runs) -> None:
    # More values than sqlite binds in one statement (250000 in Debian's build, 32766
    # upstream), with the recorded ones spread over the first, a middle and the last chunk.
    wanted = [f"fp-{i:06d}" for i in range(250_001)]
    recorded = {wanted[0]: 1, wanted[499]: 2, wanted[500]: 3, wanted[123_456]: 4, wanted[-1]: 5}
    ids = {fp: runs.add(fp, start) for fp, start in recorded.items()}
    found = find_runs(runs.client, runs.here, wanted)
    assert {fp: [r.run_id for r in records] for fp, records in found.items()} == {
        fp: [run_id] for fp, run_id in ids.items()
    }


def test_the_server_path_finds_what_the_database_path_finds(runs: Runs) -> None:
    # An MLflow server offers no SQL: the lookup pages through search_runs instead. Both paths
    # run here against the same sqlite store and must agree run for run, tag for tag.
    for i in range(3):
        runs.add(f"fp-{i}", 1000 + i, RunStatus.FINISHED, tags={Tags.JOB_NUM: str(i)})
        runs.add(f"fp-{i}", 2000 + i, RunStatus.KILLED, tags={Tags.PARENT_RUN: "p", "x": "y"})
        runs.add(f"fp-{i}", 3000 + i, RunStatus.FAILED, deleted=True)
        runs.add(f"fp-{i}", 4000 + i, experiment=runs.other)
    runs.add("fp-not-wanted", 5000)
    wanted = {"fp-0", "fp-1", "fp-2", "fp-missing"}
    store = runs.client._tracking_client.store
    assert hasattr(store, "ManagedSessionMaker")  # find_runs itself takes the database path

    def records(found: Any) -> list[tuple[str, str, RunStatus, int, dict[str, str]]]:
        return sorted((r.run_id, r.fingerprint, r.status, r.start_time_ms, r.tags) for r in found)

    from_database = records(flat(find_runs(runs.client, runs.here, wanted)))
    from_search = records(flat(find_runs(ThroughAServer(runs.client), runs.here, wanted)))
    assert len(from_database) == 6
    assert from_search == from_database


def test_the_server_path_pages_through_every_run(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pages of 2 runs: every page's token must be followed, or runs go missing.
    search_runs = runs.client.search_runs

    def small_pages(*args: Any, **kwargs: Any) -> Any:
        return search_runs(*args, **{**kwargs, "max_results": 2})

    monkeypatch.setattr(runs.client, "search_runs", small_pages)
    ids = {runs.add(f"fp-{i}", i) for i in range(7)}
    found = find_runs(ThroughAServer(runs.client), runs.here, {f"fp-{i}" for i in range(7)})
    assert {r.run_id for r in flat(found)} == ids


def test_claims_and_followed_runs_are_read_alike_on_both_paths(runs: Runs) -> None:
    # A check of claims reads RUNNING runs only; a followed run is read by its id. Both paths
    # (SQL here, search_runs on a server) must agree.
    running = runs.add("fp", 1000, tags={Tags.CLAIM: "won"})
    confirmed = runs.add("fp", 1500)
    runs.client.log_param(confirmed, "lr", "0.1")  # a won claim's params
    finished = runs.add("fp", 2000, RunStatus.FINISHED)
    deleted = runs.add("fp", 3000, deleted=True)
    other = runs.add("fp-other", 4000)
    runs.add("fp", 5000, experiment=runs.other)

    claims = find_runs(runs.client, runs.here, ["fp"], running_only=True)["fp"]
    assert [(r.run_id, r.params_logged) for r in claims] == [(confirmed, True), (running, False)]
    searched = find_runs(ThroughAServer(runs.client), runs.here, ["fp"], running_only=True)
    assert searched == {"fp": claims}

    wanted = {running, confirmed, finished, deleted, other, "no-such-run"}
    by_id = runs_by_id(runs.client, runs.here, wanted)
    assert sorted(by_id) == sorted([running, confirmed, finished, other])  # deleted: let go
    assert by_id[finished].status is RunStatus.FINISHED and by_id[other].fingerprint == "fp-other"
    assert by_id[running].tags[Tags.CLAIM] == "won"
    assert by_id[confirmed].params_logged and not by_id[running].params_logged
    assert runs_by_id(ThroughAServer(runs.client), runs.here, wanted) == by_id
    assert runs_by_id(runs.client, runs.here, []) == {}


def test_the_sqlite_reader_finds_what_mlflow_finds(runs: Runs, mlflow_store: str) -> None:
    # A rerun reads a sqlite store without MLflow: the same runs, tags, decisions and metrics.
    for i in range(3):
        runs.add(f"fp-{i}", 1000 + i, RunStatus.FINISHED, tags={Tags.JOB_NUM: str(i), "x": "y"})
        runs.add(f"fp-{i}", 2000 + i, RunStatus.KILLED, tags={Tags.PARENT_RUN: "p"})
        runs.add(f"fp-{i}", 3000 + i, RunStatus.FAILED, deleted=True)
        runs.add(f"fp-{i}", 4000 + i, experiment=runs.other)
    dead = exited_launcher().tags()
    running = runs.add("fp-running", 500, tags=dead)
    runs.client.log_metric(running, "loss", 0.5)
    runs.client.log_metric(running, "loss", 0.25, step=1)
    wanted = {"fp-0", "fp-1", "fp-2", "fp-running", "fp-missing"}
    path = Path(mlflow_store.removeprefix("sqlite:///"))
    reader = SqliteReader(path, "here")
    assert reader.experiment_id == runs.here

    found = reader.find_runs(wanted)
    assert found == find_runs(runs.client, runs.here, wanted)
    here = LauncherIdentity.current()
    decided = reader.decide(wanted, Rerun.FAILED, None, here, 60.0)
    expected = {fp: decide(found.get(fp, []), Rerun.FAILED, lambda r: "gone") for fp in wanted}
    assert {fp: (d.action, d.record) for fp, d in decided.items()} == {
        fp: (d.action, d.record) for fp, d in expected.items()
    }
    assert decided["fp-running"].action is Action.RESUME  # its launcher has exited
    assert reader.latest_metrics([running]) == {running: {"loss": 0.25}}
    assert SqliteReader(path, "no such experiment").find_runs(wanted) == {}
    assert SqliteReader(path.with_name("missing.db"), "here").find_runs(wanted) == {}


def test_the_sqlite_reader_waits_for_a_store_being_created(tmp_path: Path) -> None:
    # A launcher creating the store holds its schema lock while MLflow makes the tables; a
    # rerun's reader that found the file meanwhile reads it once it is made, not half made.
    path = tmp_path / "mlflow.db"
    found: list[str | None] = []
    with creating_sqlite_schema(path):
        sqlite3.connect(path).close()  # the file exists, with no table yet
        reader = threading.Thread(
            target=lambda: found.append(SqliteReader(path, "e").experiment_id)
        )
        reader.start()
        reader.join(timeout=0.5)
        assert reader.is_alive()  # waiting for the creator's lock
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT)")
            connection.execute("INSERT INTO experiments VALUES (7, 'e')")
    reader.join(timeout=30)
    assert found == ["7"]
