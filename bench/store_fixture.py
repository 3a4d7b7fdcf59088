"""The store benchmarks' fixture: ``runs`` recorded job runs, as a sqlite file or a PostgreSQL
database MLflow created.

MLflow creates the schema (its migrations) and the experiment; the runs go into the tables of
MLflow's own ORM models (``SqlRun``, ``SqlTag``, ``SqlParam``, ``SqlLatestMetric``,
``SqlMetric``), a sweep per transaction: on sqlite an ``executemany`` of each model's INSERT,
on PostgreSQL a ``COPY`` of the same columns (~1 min per 100,000 runs either way, where
``MlflowClient`` takes ~20 ms a run). The rows are what MLflow's own writes leave (a run's
columns, its tags, params and latest metrics) and ``check_fixture`` reads a sample back with
plain ``MlflowClient`` calls, so a store MLflow would not read fails before anything is timed.
``sweeps`` sweeps of job runs (10,000 runs per sweep in bench/store_scale.py), each under a sweep
run, every job run carrying the tags a launcher writes, 16 params of a
model/optim/data/trainer config (through ``flatten_params``, fingerprinted with
``fingerprint``) and 3 latest metrics; 90 % FINISHED, 7 % FAILED, 3 % KILLED; the last 1 in 20
runs re-run configs whose first run failed or was killed. Run ids are drawn from a seeded
generator, so the sqlite and PostgreSQL fixtures of one spec hold the same runs.

Cached under bench/results/, keyed by the spec and the MLflow version (bump FIXTURE_VERSION
when the content changes): a sqlite file, or a database in the cluster kept there
(``bench/postgres.py``). Used by ``bench/skip_check.py``, ``bench/claim_cost.py`` and
``bench/store_scale.py``; delete ``bench/results/store-fixture-*`` (and
``bench/results/postgres``) to rebuild.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR
from bench.postgres import Cluster
from furcate_hydra.store import Tags, flatten_params
from furcate_hydra.store.fingerprint import fingerprint

__all__ = [
    "EXPERIMENT",
    "FixtureSpec",
    "cached_fixture",
    "cached_postgres_fixture",
    "check_fixture",
    "query_fingerprints",
    "task_config",
]

EXPERIMENT = "bench-store"
# Bump when the fixture's content changes, so a cached store is rebuilt.
FIXTURE_VERSION = 2


@dataclass(frozen=True)
class FixtureSpec:
    """A store of ``runs`` job runs in ``sweeps`` sweeps; the last ``reruns`` (1 in 20) re-run
    configs whose first run failed or was killed, so those configs have two runs."""

    runs: int = 10_000
    sweeps: int = 10
    seed: int = 0

    @property
    def reruns(self) -> int:
        return self.runs // 20

    @property
    def recorded_configs(self) -> int:
        return self.runs - self.reruns

    def key(self) -> str:
        text = json.dumps(
            {
                "version": FIXTURE_VERSION,
                "mlflow": metadata.version("mlflow"),
                "runs": self.runs,
                "sweeps": self.sweeps,
                "reruns": self.reruns,
                "seed": self.seed,
            },
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def task_config(i: int) -> dict[str, Any]:
    """Config ``i`` of a typical training sweep: 16 params once flattened."""
    return {
        "seed": i,
        "model": {
            "name": "mlp",
            "hidden": (64, 128, 256)[i % 3],
            "layers": [64, 32],
            "dropout": round(0.1 * (i % 5), 1),
            "activation": "relu",
        },
        "optim": {
            "name": "adam",
            "lr": (1e-1, 1e-2, 1e-3, 1e-4)[i % 4],
            "weight_decay": 1e-4,
            "betas": [0.9, 0.999],
        },
        "data": {"name": "digits", "batch_size": 32 * (1 + i % 4), "num_workers": 0, "val": 0.2},
        "trainer": {"max_epochs": 10, "precision": "32"},
    }


def _status(rng: random.Random) -> str:
    draw = rng.random()
    return "FINISHED" if draw < 0.90 else "FAILED" if draw < 0.97 else "KILLED"


def _sweep_rows(
    spec: FixtureSpec, experiment_id: int, artifacts: str, sweep: int, failed_configs: list[int]
) -> dict[str, list[dict[str, Any]]]:
    """The rows of sweep ``sweep``: its sweep run and its job runs, per MLflow table."""
    rng = random.Random(spec.seed * 1_000_003 + sweep)
    t0 = 1_780_000_000_000  # ms
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in _TABLES}

    def add_run(run_id: str, name: str, status: str, start: int, run_tags: dict[str, str]) -> None:
        rows["runs"].append(
            {
                "run_uuid": run_id,
                "name": name,
                "source_type": "UNKNOWN",
                "source_name": "",
                "entry_point_name": "",
                "user_id": "",
                "status": status,
                "start_time": start,
                "end_time": start + 60_000,
                "source_version": "",
                "lifecycle_stage": "active",
                "artifact_uri": f"{artifacts}/{run_id}/artifacts",
                "experiment_id": experiment_id,
            }
        )
        run_tags[Tags.RUN_NAME] = name
        rows["tags"].extend({"key": k, "value": v, "run_uuid": run_id} for k, v in run_tags.items())

    per_sweep = spec.runs // spec.sweeps
    sweep_id = uuid.UUID(int=rng.getrandbits(128)).hex
    # a sweep a day or so, over as long as the store's sweeps take
    sweep_start = t0 + sweep * 86_400_000
    day = f"{2026 + sweep // 365}-{1 + sweep % 365 // 31:02d}-{1 + sweep % 31:02d}"
    identity = {
        Tags.HOST: f"node-{sweep % 4}",
        Tags.BOOT_ID: "0f6c2a8e-3b1d-4c55-9e0a-7d2f9b1c4e6a",
        Tags.LAUNCHER_PID: str(4000 + sweep),
        Tags.LAUNCHER_STARTED: str(100_000 + sweep),
    }
    sweep_dir = f"/data/multirun/{day}/12-00-{sweep % 60:02d}"
    add_run(
        sweep_id,
        f"sweep {day}/12-00-{sweep % 60:02d}",
        "FINISHED",
        sweep_start,
        {
            **identity,
            Tags.ROLE: "sweep",
            Tags.SWEEP_DIR: sweep_dir,
            Tags.OVERRIDES: "-m model.hidden=64,128,256 optim.lr=0.1,0.01,0.001,0.0001",
            Tags.HEARTBEAT: f"{sweep_start / 1000 + 3600:.3f}",
        },
    )
    for job_num in range(per_sweep):
        n = sweep * per_sweep + job_num
        # The last ``reruns`` runs re-run configs that failed or were killed before.
        i = n if n < spec.recorded_configs else failed_configs[n - spec.recorded_configs]
        config = task_config(i)
        status = _status(rng)
        if n < spec.recorded_configs and status != "FINISHED":
            failed_configs.append(i)
        run_id = uuid.UUID(int=rng.getrandbits(128)).hex
        start = sweep_start + job_num * 1000
        overrides = f"seed={i} model.hidden={config['model']['hidden']}"
        output_dir = f"{sweep_dir}/{job_num}"
        job_tags = {
            **identity,
            Tags.FINGERPRINT: fingerprint(config),
            Tags.OVERRIDES: overrides,
            Tags.JOB_NUM: str(job_num),
            Tags.OUTPUT_DIR: output_dir,
            Tags.CHECKPOINT_DIR: f"{output_dir}/checkpoints",
            Tags.PARENT_RUN: sweep_id,
        }
        if status == "FINISHED":
            job_tags[Tags.RETURN_VALUE] = f'json:{{"val_loss": {rng.random():.6f}}}'
        else:
            job_tags[Tags.ERROR] = "RuntimeError: CUDA error: out of memory"
        add_run(run_id, overrides, status, start, job_tags)
        rows["params"].extend(
            {"key": k, "value": v, "run_uuid": run_id} for k, v in flatten_params(config).items()
        )
        for name in ("train_loss", "val_loss", "val_acc"):
            rows["latest_metrics"].append(
                {
                    "key": name,
                    "value": rng.random(),
                    "timestamp": start + 50_000,
                    "step": 9,
                    "is_nan": False,
                    "run_uuid": run_id,
                }
            )
    rows["metrics"] = rows["latest_metrics"]
    return rows


# MLflow's tables the fixture fills, in the order their foreign keys allow.
_TABLES = ("runs", "tags", "params", "latest_metrics", "metrics")


def build_fixture(spec: FixtureSpec, uri: str, artifacts: Path) -> dict[str, Any]:
    """Write the store at ``uri`` (sqlite or PostgreSQL): MLflow makes the schema and the
    experiment, then the rows go into the tables of MLflow's ORM models, a sweep at a time."""
    from mlflow.tracking import MlflowClient

    began = time.perf_counter()
    client = MlflowClient(uri)  # creates MLflow's schema (its migrations)
    experiment_id = int(client.create_experiment(EXPERIMENT, artifact_location=str(artifacts)))
    counts = dict.fromkeys(_TABLES, 0)
    failed_configs: list[int] = []
    with _writer(uri) as write:
        for sweep in range(spec.sweeps):
            rows = _sweep_rows(spec, experiment_id, str(artifacts), sweep, failed_configs)
            for table in _TABLES:
                write(table, rows[table])
                counts[table] += len(rows[table])
    return {
        "job_runs": spec.runs,
        "sweep_runs": spec.sweeps,
        "jobs_per_sweep": spec.runs // spec.sweeps,
        "configs_recorded": spec.recorded_configs,
        "configs_with_two_runs": spec.reruns,
        "rows": counts,
        "build_s": round(time.perf_counter() - began, 1),
    }


@contextlib.contextmanager
def _writer(uri: str) -> Iterator[Callable[[str, list[dict[str, Any]]], None]]:
    """A function writing rows into one of MLflow's tables (its ORM model's ``Table``):
    ``executemany`` of the model's INSERT on sqlite, PostgreSQL's ``COPY`` of the same columns
    there (the bulk path: inserts would take ~20 min for 1M runs). One transaction a sweep."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels import models

    tables = {
        "runs": models.SqlRun.__table__,
        "tags": models.SqlTag.__table__,
        "params": models.SqlParam.__table__,
        "latest_metrics": models.SqlLatestMetric.__table__,
        "metrics": models.SqlMetric.__table__,
    }
    engine = sa.create_engine(uri)
    postgres = engine.dialect.name == "postgresql"
    if not postgres:
        # a file being built: no fsync per sweep, and its indexes' pages kept in memory
        def fast(connection: Any, _: Any) -> None:
            connection.execute("PRAGMA synchronous = OFF")
            connection.execute("PRAGMA cache_size = -2000000")  # KiB

        sa.event.listen(engine, "connect", fast)

    def write(table: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        model = tables[table]
        if not postgres:
            with engine.begin() as connection:
                connection.execute(sa.insert(model), rows)
            return
        names = list(rows[0])
        buffer = io.StringIO()
        # quoted strings: an unquoted empty field is NULL to COPY, and MLflow's "" is not
        out = csv.writer(buffer, quoting=csv.QUOTE_NONNUMERIC)
        out.writerows([row[name] for name in names] for row in rows)
        buffer.seek(0)
        raw: Any = engine.raw_connection()
        try:
            with raw.cursor() as cursor:
                columns = ", ".join(f'"{name}"' for name in names)
                cursor.copy_expert(f"COPY {model.name} ({columns}) FROM STDIN WITH CSV", buffer)
            raw.commit()
        finally:
            raw.close()

    try:
        yield write
    finally:
        engine.dispose()


def cached_fixture(spec: FixtureSpec) -> tuple[Path, dict[str, Any]]:
    """The sqlite store for ``spec``, built once and kept in bench/results/."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"store-fixture-{spec.key()}.db"
    info_path = path.with_suffix(".json")
    if path.exists() and info_path.exists():
        return path, {**json.loads(info_path.read_text()), "cached": True}
    print(f"building the store fixture ({spec.runs} runs), once", flush=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    info = build_fixture(spec, f"sqlite:///{partial}", path.parent / "mlruns")
    partial.rename(path)
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return path, {**info, "cached": False}


def check_fixture(client: Any, experiment_id: str, spec: FixtureSpec) -> dict[str, Any]:
    """Read a sample back with plain MlflowClient calls: MLflow must see valid runs."""
    sample = client.search_runs(
        [experiment_id], filter_string=f"tags.`{Tags.ROLE}` != 'sweep'", max_results=20
    )
    sample += client.search_runs(
        [experiment_id], filter_string="attributes.status = 'FAILED'", max_results=5
    )
    for run in sample:
        data = run.data
        assert run.info.status in ("FINISHED", "FAILED", "KILLED"), run.info.status
        assert len(data.params) == 16 and len(data.metrics) == 3, run.info.run_id
        assert Tags.FINGERPRINT in data.tags and Tags.PARENT_RUN in data.tags, run.info.run_id
        assert run.info.run_name == data.tags[Tags.RUN_NAME]
    one = client.get_run(sample[-1].info.run_id)
    assert one.data.params == sample[-1].data.params
    fp = fingerprint(task_config(spec.recorded_configs - 1))
    found = client.search_runs([experiment_id], filter_string=f"tags.`{Tags.FINGERPRINT}` = '{fp}'")
    assert len(found) == 1 and found[0].data.params["seed"] == str(spec.recorded_configs - 1)
    return {"runs_read_back": len(sample) + 2, "valid": True}


def query_fingerprints(spec: FixtureSpec, recorded: int, new: int) -> list[str]:
    """``recorded`` configs drawn from the store (any status) and ``new`` never recorded."""
    rng = random.Random(1)
    known = rng.sample(range(spec.recorded_configs), recorded)
    unknown = range(spec.runs + 1000, spec.runs + 1000 + new)
    fps = [fingerprint(task_config(i)) for i in [*known, *unknown]]
    rng.shuffle(fps)
    return fps


def cached_postgres_fixture(spec: FixtureSpec, cluster: Cluster) -> tuple[str, dict[str, Any]]:
    """The PostgreSQL database for ``spec`` in ``cluster`` (started), built once: the cluster's
    folder under bench/results/ keeps it. Returns the database's name."""
    name = f"fixture_{spec.key()}"
    info_path = RESULTS_DIR / f"store-fixture-{spec.key()}-postgres.json"
    if name in cluster.databases() and info_path.exists():
        return name, {**json.loads(info_path.read_text()), "cached": True}
    print(f"building the PostgreSQL store fixture ({spec.runs} runs), once", flush=True)
    if name in cluster.databases():
        cluster.psql("postgres", f"DROP DATABASE {name}")
    cluster.psql("postgres", f"CREATE DATABASE {name}")
    info = build_fixture(spec, cluster.url(name), RESULTS_DIR / "mlruns")
    # what autovacuum would have done by the time a store held this many runs
    cluster.psql(name, "ANALYZE")
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return name, {**info, "cached": False}
