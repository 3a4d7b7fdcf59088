"""furcate index: the lookups that match tag values use it, MLflow keeps working and migrating
around it, and --drop leaves MLflow's schema as MLflow made it. Real sqlite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from mlflow.tracking import MlflowClient

from furcate_hydra.cli.main import main
from furcate_hydra.store import Tags
from furcate_hydra.store.store_index import create_indexes, drop_indexes, store_indexes

# the skip check's SELECT (store/lookup.py, store/sqlite_reader.py) and MLflow's search of
# one sweep's runs, by their tag conditions
SKIP_CHECK = (
    "SELECT r.run_uuid FROM runs r JOIN tags fp ON fp.run_uuid = r.run_uuid AND fp.key = "
    f"'{Tags.FINGERPRINT}' WHERE r.experiment_id = 1 AND fp.value IN ('fp1', 'fp2')"
)
ONE_SWEEP = f"SELECT run_uuid FROM tags WHERE key = '{Tags.PARENT_RUN}' AND value = 'p1'"
# the MLflow revision before a migration that rebuilds the tags table (its value limit)
BEFORE_TAGS_REBUILT = "4465047574b1"


def _plans(engine: sa.Engine, explain: str) -> str:
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            connection.exec_driver_sql("SET enable_seqscan = off")  # tiny tables: no choice
        return "\n".join(
            str(row) for sql in (SKIP_CHECK, ONE_SWEEP)
            for row in connection.exec_driver_sql(f"{explain} {sql}")
        )  # fmt: skip


def _old_store(url: str) -> None:
    """A store MLflow made at an older revision: `mlflow db upgrade` has migrations to run."""
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    with engine.begin() as connection:
        config = _get_alembic_config(url)  # type: ignore[no-untyped-call]
        config.attributes["connection"] = connection
        command.upgrade(config, BEFORE_TAGS_REBUILT)
    engine.dispose()


def _check_store(url: str, explain: str, capsys: pytest.CaptureFixture[str]) -> None:
    _old_store(url)
    engine = sa.create_engine(url)
    names = {index.name for index in store_indexes(engine.dialect.name)}
    assert main(["index", "--tracking-uri", url]) == 0
    assert capsys.readouterr().out.startswith("made ")
    assert create_indexes(engine) == []  # made once

    upgrade = subprocess.run(
        [sys.executable, "-m", "mlflow", "db", "upgrade", url], capture_output=True, text=True
    )
    assert upgrade.returncode == 0, upgrade.stderr[-2000:]
    # MLflow writes and searches as before, a tag of its longest value too
    client = MlflowClient(url)
    experiment = client.create_experiment("e")
    for i in range(150):  # enough rows that an index on values pays
        tags = {Tags.PARENT_RUN: f"p{i % 3}", Tags.FINGERPRINT: f"fp{i}", "note": "n" * 8000}
        client.create_run(experiment, tags=tags)
    found = client.search_runs([experiment], f"tags.`{Tags.PARENT_RUN}` = 'p1'")
    assert len(found) == 50
    with engine.connect() as connection:
        connection.exec_driver_sql("ANALYZE")  # what autovacuum does to a store in use
        connection.commit()
    engine.dispose()  # a connection's statements are planned against the schema it saw
    plans = _plans(engine, explain)
    assert all(name in plans for name in names), plans

    assert main(["index", "--drop", "--tracking-uri", url]) == 0
    assert capsys.readouterr().out.startswith("dropped ")
    engine.dispose()
    plans = _plans(engine, explain)
    assert not any(name in plans for name in names), plans
    assert drop_indexes(engine) == []
    engine.dispose()


@pytest.mark.slow
def test_sqlite_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check_store(f"sqlite:///{tmp_path / 'mlflow.db'}", "EXPLAIN QUERY PLAN", capsys)


def test_refuses_a_server_and_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["index", "--tracking-uri", "http://127.0.0.1:5000"]) == 2
    assert "--backend-store-uri" in capsys.readouterr().err
    assert main(["index", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "no such sqlite file" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_postgres_store(postgres: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """On the shared PostgreSQL of tests/conftest.py (skipped where it is not installed)."""
    pytest.importorskip("psycopg2")
    _check_store(postgres.create_database("furcate_index"), "EXPLAIN", capsys)


def test_claim_check_reads_the_fingerprints_runs_by_the_index(tmp_path: Path) -> None:
    """On an indexed store the check of claims asks for the fingerprints' RUNNING runs, not
    for the experiment's RUNNING runs first (a scan of every run); the answer is the same."""
    from furcate_hydra.store.lookup import find_runs

    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(url)
    experiment = client.create_experiment("e")
    for i, status in enumerate(["RUNNING", "FINISHED", "RUNNING", "FAILED"]):
        run = client.create_run(experiment, tags={Tags.FINGERPRINT: f"fp{i % 2}"})
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status)
    statements: list[str] = []

    def running_fp0() -> list[str]:
        statements.clear()
        found = find_runs(client, experiment, ["fp0", "fp1"], running_only=True)
        return sorted(r.run_id for runs in found.values() for r in runs)

    engine = client._tracking_client.store.engine
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    plain = running_fp0()
    assert len(plain) == 2 and any("IN (SELECT runs.run_uuid" in s for s in statements)
    assert create_indexes(engine)
    assert running_fp0() == plain
    assert not any("IN (SELECT runs.run_uuid" in s for s in statements), statements


def _furcate_indexes(path: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        return {name for (name,) in rows if name.startswith("furcate_")}


def test_a_sweep_indexes_its_sqlite_store_unless_told_not_to(
    tmp_path: Path, mlflow_store: str
) -> None:
    """hydra.launcher.mlflow.sqlite_index (default true): a sweep gives a sqlite store the
    index its skip and claim checks read by; false leaves the store as MLflow made it."""
    from tests.conftest import run_probe_sweep

    store = Path(mlflow_store.removeprefix("sqlite:///"))
    assert _furcate_indexes(store) == set()
    off = run_probe_sweep(tmp_path, "+x=1,2", "hydra.launcher.mlflow.sqlite_index=false")
    assert off.returncode == 0, off.stderr[-3000:]
    assert _furcate_indexes(store) == set()
    # the next sweep reads the two recorded configs by the index it made
    on = run_probe_sweep(tmp_path, "+x=1,2,3")
    assert on.returncode == 0, on.stderr[-3000:]
    assert _furcate_indexes(store) == {"furcate_tags_key_value"}
    assert "skipped" in on.stdout + on.stderr
    client = MlflowClient(mlflow_store)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, f"tags.`{Tags.FINGERPRINT}` LIKE '%'")
    assert len(runs) == 3


def test_index_sqlite_store_makes_it_once_and_leaves_other_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import sqlite3

    from furcate_hydra.store import store_index
    from furcate_hydra.store.store_index import index_sqlite_store

    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(url)
    experiment = client.create_experiment("e")
    for i in range(3):
        client.create_run(experiment, tags={Tags.FINGERPRINT: f"fp{i}"})
    engine = client._tracking_client.store.engine
    assert not store_index.tags_indexed(engine)  # cached as the process saw it ...
    with caplog.at_level(logging.INFO, logger=store_index.__name__):
        assert index_sqlite_store(tmp_path / "mlflow.db")
    assert "made furcate_tags_key_value" in caplog.text and "--drop" in caplog.text
    assert store_index.tags_indexed(engine)  # ... and asked again once furcate made it
    assert not index_sqlite_store(tmp_path / "mlflow.db")
    assert _furcate_indexes(tmp_path / "mlflow.db") == {"furcate_tags_key_value"}

    missing = tmp_path / "new.db"  # MLflow makes a new store: nothing is made before it
    assert not index_sqlite_store(missing) and not missing.exists()

    other = tmp_path / "other.db"  # no MLflow store (yet): left as it is
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    assert not index_sqlite_store(other)
    assert _furcate_indexes(other) == set()

    damaged = tmp_path / "damaged.db"  # what it cannot read: said, and the sweep goes on
    damaged.write_bytes(b"not a database, " * 512)
    with caplog.at_level(logging.WARNING, logger=store_index.__name__):
        assert not index_sqlite_store(damaged)
    assert "could not index the tags of" in caplog.text and "furcate index" in caplog.text
