"""The skip check's store: 10,000 recorded job runs in a sqlite file MLflow created.

MLflow creates the file (schema and migrations) and the experiment; the runs go in through
MLflow's own ORM models (``SqlRun``, ``SqlTag``, ``SqlParam``, ``SqlLatestMetric``,
``SqlMetric``) in one session, ~8 s, where 10,000 runs through ``MlflowClient`` take minutes:
``sweeps`` sweeps of job runs, each under a sweep run, every job run carrying the tags a
launcher writes, 16 params of a model/optim/data/trainer config (through ``flatten_params``,
fingerprinted with ``fingerprint``) and 3 latest metrics; 90 % FINISHED, 7 % FAILED, 3 % KILLED;
the last 1 in 20 runs re-run configs whose first run failed or was killed. The file is cached
under bench/results/, keyed by its parameters and the MLflow version (bump FIXTURE_VERSION when
the content changes). ``check_fixture`` reads a sample back with plain ``MlflowClient`` calls,
so a store MLflow would not read fails before anything is timed.

Used by ``bench/skip_check.py``; delete ``bench/results/store-fixture-*`` to rebuild.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR
from furcate_hydra.store import Tags, flatten_params
from furcate_hydra.store.fingerprint import fingerprint

__all__ = [
    "EXPERIMENT",
    "FixtureSpec",
    "cached_fixture",
    "check_fixture",
    "query_fingerprints",
    "task_config",
]

EXPERIMENT = "bench-store"
# Bump when the fixture's content changes, so a cached store is rebuilt.
FIXTURE_VERSION = 1


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


def build_fixture(spec: FixtureSpec, path: Path) -> dict[str, Any]:
    """Write the store at ``path`` through MLflow's ORM models, in one session."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import (
        SqlLatestMetric,
        SqlMetric,
        SqlParam,
        SqlRun,
        SqlTag,
    )
    from mlflow.tracking import MlflowClient

    began = time.perf_counter()
    client = MlflowClient(f"sqlite:///{path}")  # creates MLflow's schema
    artifacts = path.parent / "mlruns"
    experiment_id = int(client.create_experiment(EXPERIMENT, artifact_location=str(artifacts)))
    rng = random.Random(spec.seed)
    t0 = 1_780_000_000_000  # ms
    runs: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    params: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []

    def add_run(run_id: str, name: str, status: str, start: int, run_tags: dict[str, str]) -> None:
        runs.append(
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
        tags.extend({"key": k, "value": v, "run_uuid": run_id} for k, v in run_tags.items())

    per_sweep = spec.runs // spec.sweeps
    failed_configs: list[int] = []
    for sweep in range(spec.sweeps):
        sweep_id = uuid.uuid4().hex
        sweep_start = t0 + sweep * 86_400_000
        identity = {
            Tags.HOST: "node-1",
            Tags.BOOT_ID: "0f6c2a8e-3b1d-4c55-9e0a-7d2f9b1c4e6a",
            Tags.LAUNCHER_PID: str(4000 + sweep),
            Tags.LAUNCHER_STARTED: str(100_000 + sweep),
        }
        sweep_dir = f"/data/multirun/2026-11-{10 + sweep:02d}/12-00-00"
        add_run(
            sweep_id,
            f"sweep 2026-11-{10 + sweep:02d}/12-00-00",
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
            run_id = uuid.uuid4().hex
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
            params.extend(
                {"key": k, "value": v, "run_uuid": run_id}
                for k, v in flatten_params(config).items()
            )
            for name in ("train_loss", "val_loss", "val_acc"):
                value = rng.random()
                metrics.append(
                    {
                        "key": name,
                        "value": value,
                        "timestamp": start + 50_000,
                        "step": 9,
                        "is_nan": False,
                        "run_uuid": run_id,
                    }
                )
    store: Any = client._tracking_client.store
    with store.ManagedSessionMaker() as session:
        session.execute(sa.insert(SqlRun), runs)
        session.execute(sa.insert(SqlTag), tags)
        session.execute(sa.insert(SqlParam), params)
        session.execute(sa.insert(SqlLatestMetric), metrics)
        session.execute(sa.insert(SqlMetric), metrics)
    return {
        "job_runs": spec.runs,
        "sweep_runs": spec.sweeps,
        "configs_recorded": spec.recorded_configs,
        "configs_with_two_runs": spec.reruns,
        "rows": {"tags": len(tags), "params": len(params), "latest_metrics": len(metrics)},
        "build_s": round(time.perf_counter() - began, 1),
    }


def cached_fixture(spec: FixtureSpec) -> tuple[Path, dict[str, Any]]:
    """The store for ``spec``, built once and kept in bench/results/."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"store-fixture-{spec.key()}.db"
    info_path = path.with_suffix(".json")
    if path.exists() and info_path.exists():
        return path, {**json.loads(info_path.read_text()), "cached": True}
    print(f"building the store fixture ({spec.runs} runs), once")
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    info = build_fixture(spec, partial)
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
