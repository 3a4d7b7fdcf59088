"""A Slurm job array of launchers, one sweep: ``sbatch --array=0-3 --gres=gpu:1 job.sh``.

Four launchers run the same command, each in its own allocation (one fake GPU, one core),
recording into one ``mlflow server`` backed by a real PostgreSQL. The store's claims give each
config to one of them; ``furcate status`` shows the whole sweep from any launcher's sweep dir,
with the Slurm job and node each config ran in.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import APPS, furcate_status
from tests.slurm_cluster import ARRAY_SWEEP_DIR, SlurmCluster, run_array, sweep_script
from tests.store_helpers import job_runs
from tests.test_store_server import Server

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONFIGS = 12
TASKS = 4


def test_an_array_of_launchers_runs_each_config_once(
    slurm: SlurmCluster, tmp_path: Path, pg_mlflow: Server
) -> None:
    script = sweep_script(
        tmp_path,
        APPS / "probe_app.py",
        pg_mlflow.url,
        "+i=" + ",".join(map(str, range(CONFIGS))),
        "sleep=2",
        # furcate's grid sweeper hands a launcher a config per free slot (Hydra's basic one
        # hands it the whole grid, all claimed by the first launcher to look)
        "hydra/sweeper=furcate",
        # a config held by another launcher gets a dir in each, naming the run that ran it
        f"hydra.sweep.dir={tmp_path}/{ARRAY_SWEEP_DIR}",
    )
    job = run_array(slurm, tmp_path, script, TASKS)
    logs = {p.name: p.read_text() for p in tmp_path.glob("slurm-*.out")}
    assert len(logs) == TASKS, logs

    ran = collections.Counter(
        json.loads(p.read_text())["num"] for p in tmp_path.glob("multirun/*/*/probe.json")
    )
    assert ran == dict.fromkeys(range(CONFIGS), 1), (ran, logs)  # each config once

    runs = [r for r in job_runs(pg_mlflow.url) if r.info.status == "FINISHED"]
    assert len(runs) == CONFIGS, logs
    assert len({r.data.tags[Tags.FINGERPRINT] for r in runs}) == CONFIGS
    tasks = collections.Counter(r.data.tags[Tags.SLURM_JOB] for r in runs)
    assert set(tasks) <= {f"{job}_{i}" for i in range(TASKS)}
    assert len(tasks) >= 2, (tasks, logs)  # the launchers shared the grid
    print(f"\nconfigs per array task: {dict(sorted(tasks.items()))}")

    # any launcher's sweep dir shows the whole sweep, and where each config ran
    status = furcate_status(
        tmp_path / "multirun" / "0", env={**slurm.env, "MLFLOW_TRACKING_URI": pg_mlflow.url}
    )
    assert f"FINISHED {CONFIGS}" in status, status
    for run in runs:
        where = f"slurm {run.data.tags[Tags.SLURM_JOB]} on {slurm.node}"
        num = run.data.tags[Tags.JOB_NUM]
        (line,) = [ln for ln in status.splitlines() if ln.split()[:1] == [num]]
        assert where in line, status
