"""``hydra.launcher.backend=slurm``: the sweep submitted from the login node, no job.sh.

The real CLI on this machine (the login node of the test cluster, whose one node is named
``furcate-node0``): the launcher writes the batch script, submits the allocations with sbatch
and returns, or follows them; ``furcate status`` follows the sweep from anywhere. The store is
an ``mlflow server`` on PostgreSQL, which every node reaches.
"""

from __future__ import annotations

import collections
import json
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import APPS, furcate_status
from tests.slurm_cluster import SlurmCluster, wait_until
from tests.store_helpers import job_runs
from tests.test_store_server import Server

pytestmark = pytest.mark.slurm

CONFIGS = 6
# two allocations of two GPUs and two CPUs each, followed until they end
TWO_ALLOCATIONS = (
    "hydra.launcher.slurm.allocations=2",
    "hydra.launcher.slurm.gpus_per_allocation=2",
    "hydra.launcher.slurm.cpus_per_allocation=2",
    "hydra.launcher.slurm.time=10",
    "hydra.launcher.slurm.wait=true",
    "hydra.launcher.slurm.poll_s=1",
)


def sweep_from_login_node(
    slurm: SlurmCluster, tmp_path: Path, uri: str, *overrides: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(APPS / "probe_app.py"),
            "-m",
            "+i=" + ",".join(map(str, range(CONFIGS))),
            "sleep=1",
            "hydra/sweeper=furcate",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "hydra.launcher.backend=slurm",
            "hydra.launcher.progress=plain",
            *overrides,
        ],
        cwd=tmp_path,
        env={**slurm.env, "MLFLOW_TRACKING_URI": uri},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def status(slurm: SlurmCluster, sweep: Path, uri: str) -> str:
    return furcate_status(sweep, env={**slurm.env, "MLFLOW_TRACKING_URI": uri})


def ran(tmp_path: Path) -> collections.Counter[int]:
    probes = [*tmp_path.glob("sweep/*/probe.json"), *tmp_path.glob("sweep.*/*/probe.json")]
    return collections.Counter(json.loads(p.read_text())["num"] for p in probes)


@pytest.mark.slow  # an mlflow server, two allocations
def test_allocations_submitted_from_the_login_node_share_the_sweep(
    slurm: SlurmCluster, tmp_path: Path, pg_mlflow: Server
) -> None:
    done = sweep_from_login_node(slurm, tmp_path, pg_mlflow.url, *TWO_ALLOCATIONS)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "submitted Slurm job" in output and "2 completed" in output, output
    assert ran(tmp_path) == dict.fromkeys(range(CONFIGS), 1), output  # each config once

    script = tmp_path / "sweep" / "furcate_slurm.sh"
    # it exports the store's URL (a password in it, often): the user's alone to read
    assert stat.S_IMODE(script.stat().st_mode) == 0o700
    (command,) = [line for line in script.read_text().splitlines() if line.startswith("exec ")]
    assert "hydra.launcher.backend=local" in command and "backend=slurm" not in command
    job = re.search(r"submitted Slurm job (\d+)", output)
    assert job is not None, output
    runs = [r for r in job_runs(pg_mlflow.url) if r.info.status == "FINISHED"]
    assert len(runs) == CONFIGS
    tasks = {r.data.tags[Tags.SLURM_JOB] for r in runs}
    assert tasks <= {f"{job.group(1)}_0", f"{job.group(1)}_1"}, tasks
    assert {r.data.tags[Tags.SLURM_NODE] for r in runs} == {slurm.node}
    # each allocation got 2 GPUs and split them into slots (GPU ids as Slurm named them)
    probes = tmp_path.glob("sweep*/*/probe.json")
    devices = {json.loads(p.read_text())["cuda_visible_devices"] for p in probes}
    assert devices <= {"0", "1", "2", "3"} and len(devices) >= 2, devices
    # furcate status, from anywhere: the whole sweep, where each config ran
    shown = status(slurm, tmp_path / "sweep", pg_mlflow.url)
    assert f"FINISHED {CONFIGS}" in shown and f"on {slurm.node}]" in shown, shown


@pytest.mark.slow  # an mlflow server, one allocation
def test_without_wait_it_returns_once_submitted(
    slurm: SlurmCluster, tmp_path: Path, pg_mlflow: Server
) -> None:
    started = time.monotonic()
    done = sweep_from_login_node(
        slurm, tmp_path, pg_mlflow.url, "hydra.launcher.slurm.gpus_per_allocation=1"
    )
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "furcate status" in output, output
    # back before the allocation ran its six 1-second configs
    assert sum(ran(tmp_path).values()) < CONFIGS, (took, output)
    wait_until(lambda: not slurm.queue(), "the allocation", 180)
    assert ran(tmp_path) == dict.fromkeys(range(CONFIGS), 1)
    assert f"FINISHED {CONFIGS}" in status(slurm, tmp_path / "sweep", pg_mlflow.url)
    print(f"\nbackend=slurm returned {took:.1f} s after the command started")


# -- what cannot work there is refused before anything is submitted ------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        # the test cluster's node is not this machine, and tmp_path is on no network disk
        ([], "MLFLOW_TRACKING_URI", "do not share"),
        (["hydra.launcher.mlflow.enabled=false"], "hydra.launcher.mlflow.enabled", "claims"),
    ],
)
def test_a_store_the_nodes_cannot_share_is_refused(
    slurm: SlurmCluster, tmp_path: Path, overrides: list[str], key: str, problem: str
) -> None:
    done = sweep_from_login_node(slurm, tmp_path, f"sqlite:///{tmp_path}/mlflow.db", *overrides)
    assert done.returncode != 0
    assert f"Invalid {key}=" in done.stderr and problem in done.stderr, done.stderr
    assert "Fix:" in done.stderr
    assert not slurm.queue() and not (tmp_path / "sweep" / "furcate_slurm.sh").exists()


@pytest.mark.parametrize("storage", ["sqlite:///optuna.db", "null"])
def test_an_optuna_study_in_a_file_is_refused(
    slurm: SlurmCluster, tmp_path: Path, storage: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(APPS / "optuna_app.py"),
            "-m",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "hydra.launcher.backend=slurm",
            f"hydra.sweeper.storage={storage}",
        ],
        cwd=tmp_path,
        # a server store passes (the login node does not contact it); the study does not
        env={**slurm.env, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "Invalid hydra.sweeper.storage=" in done.stderr, done.stderr
    assert "postgresql" in done.stderr  # the fix names a database server
    assert not slurm.queue() and not (tmp_path / "optuna.db").exists()
