"""A new sqlite MLflow store is a copy of MLflow's own empty store, made once per MLflow
version: MLflow opens, reads, writes and checks it as its own; a store that exists is never
touched; launchers creating one store, or one template, at once make it once."""

from __future__ import annotations

import logging
import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from furcate_hydra.sqlite_lock import creating_sqlite_schema
from furcate_hydra.store.store_template import CACHE_VAR, seed_new_store, template_path

FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache of templates, empty: each test makes its own."""
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def schema(database: Path) -> tuple[dict[str, Any], list[str]]:
    """Each table's columns, its indexes and its constraints' lines (in any order: MLflow's
    migrations write a table's CHECK constraints in no fixed order), and alembic's version."""
    with sqlite3.connect(database) as db:
        tables: dict[str, Any] = {}
        for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
            columns = db.execute(f'PRAGMA table_info("{name}")').fetchall()
            indexes = sorted(row[1] for row in db.execute(f'PRAGMA index_list("{name}")'))
            tables[name] = (columns, indexes, sorted(line.strip() for line in sql.split("\n")))
        version = [row[0] for row in db.execute("SELECT version_num FROM alembic_version")]
    return tables, version


def test_a_new_store_is_mlflows_own_and_mlflow_uses_it_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    made_by_mlflow = tmp_path / "mlflow-made" / "mlflow.db"
    made_by_mlflow.parent.mkdir()
    MlflowClient(f"sqlite:///{made_by_mlflow}").search_experiments()

    store = tmp_path / "sweep-here" / "mlflow.db"
    store.parent.mkdir()
    assert seed_new_store(store) and template_path().is_file()
    # the same tables, indexes and alembic revision as the store MLflow made itself
    assert schema(store) == schema(made_by_mlflow)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        client = MlflowClient(f"sqlite:///{store}")
        experiments = client.search_experiments()
    assert "Creating initial MLflow database tables" not in caplog.text  # nothing left to make
    # the template holds no experiment: MLflow makes the Default one as it opens the store,
    # for where it runs (its artifact location as in the store MLflow made itself)
    with sqlite3.connect(template_path()) as db:
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    (default,) = experiments
    own = MlflowClient(f"sqlite:///{made_by_mlflow}").get_experiment("0")
    assert (default.name, default.artifact_location) == (own.name, own.artifact_location)
    experiment = client.create_experiment("sweep")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "val_loss", 0.5, step=3)
    (point,) = client.get_metric_history(run.info.run_id, "val_loss")
    assert (point.value, point.step) == (0.5, 3)


def test_a_later_new_store_copies_the_template_made_once(tmp_path: Path) -> None:
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    assert seed_new_store(first)
    made = template_path().stat().st_mtime_ns
    assert seed_new_store(second)
    assert template_path().stat().st_mtime_ns == made  # not made again
    assert second.read_bytes() == template_path().read_bytes()
    assert [p.name for p in template_path().parent.iterdir() if not p.name.endswith(".lock")] == [
        template_path().name
    ]  # no temp file left beside it


def test_a_store_that_exists_is_never_touched(tmp_path: Path) -> None:
    # one made by another MLflow version, say: MLflow opens and migrates it as always
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"a store of its own")
    assert not seed_new_store(store)
    assert store.read_bytes() == b"a store of its own"


def test_no_template_where_the_cache_cannot_be_written_and_mlflow_makes_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache would go")
    monkeypatch.setenv(CACHE_VAR, str(blocked))
    store = tmp_path / "mlflow.db"
    assert not seed_new_store(store) and not store.exists()
    MlflowClient(f"sqlite:///{store}").search_experiments()  # as always
    assert store.exists()


def seed_under_the_lock(store: Path, results: Any) -> None:
    with creating_sqlite_schema(store):
        results.put(seed_new_store(store))


def test_launchers_creating_one_store_at_once_make_it_once(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    results = FORK.Queue()
    launchers = [FORK.Process(target=seed_under_the_lock, args=(store, results)) for _ in range(3)]
    for launcher in launchers:
        launcher.start()
    seeded = sorted(results.get(timeout=120) for _ in launchers)
    for launcher in launchers:
        launcher.join(timeout=30)
        assert launcher.exitcode == 0
    assert seeded == [False, False, True]  # the first made it; the others found it made
    assert schema(store)[1]  # whole: alembic's version row is there
    MlflowClient(f"sqlite:///{store}").search_experiments()
