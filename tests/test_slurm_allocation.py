"""A sweep inside one Slurm allocation: its slots are the allocation's GPUs and cores.

A real single-node Slurm (tests/slurm_cluster.py) with four fake GPUs. A first job holds two
of them, so the sweep's allocation gets GPUs 2 and 3: node-wide ids, not renumbered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from furcate_hydra.store import Tags
from tests.conftest import APPS
from tests.slurm_cluster import SlurmCluster, sweep_script, wait_until
from tests.store_helpers import job_runs, sweep_runs

pytestmark = pytest.mark.slurm


def test_the_slots_are_the_allocations_gpus_and_cores(
    slurm: SlurmCluster, tmp_path: Path, mlflow_store: str
) -> None:
    blocker = slurm.sbatch("--gres=gpu:2", "--cpus-per-task=1", "--wrap", "sleep 300")
    wait_until(lambda: slurm.job_state(blocker).get("JobState") == "RUNNING", "the blocker", 30)
    sweep = tmp_path / "sweep"
    script = sweep_script(
        tmp_path, APPS / "probe_app.py", mlflow_store, "+i=0,1,2,3", "sleep=1",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    out = tmp_path / "slurm.out"
    job = slurm.sbatch(
        "--gres=gpu:2", "--cpus-per-task=2", f"--output={out}", f"--chdir={tmp_path}", str(script)
    )
    wait_until(lambda: slurm.job_state(job).get("JobState") == "COMPLETED", "the sweep", 120)
    slurm.run("scancel", blocker)
    log = out.read_text()
    assert "2 slots on GPUs 2,3" in log and "1 pinned core each" in log, log

    probes = [json.loads((sweep / str(i) / "probe.json").read_text()) for i in range(4)]
    devices = {p["cuda_visible_devices"] for p in probes}
    assert devices == {"2", "3"}, probes  # each slot one of the allocation's GPUs, as named
    # the allocation's two CPUs, one per slot, with no option set
    cores = {p["cuda_visible_devices"]: tuple(p["affinity"]) for p in probes}
    assert sorted(cores.values()) == [(0,), (1,)], probes
    assert {p["omp_num_threads"] for p in probes} == {"1"}

    runs = job_runs(mlflow_store)
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags[Tags.SLURM_JOB] for r in runs} == {job}
    assert {r.data.tags[Tags.SLURM_NODE] for r in runs} == {slurm.node}
    (sweep_run,) = sweep_runs(mlflow_store)
    assert sweep_run.data.tags[Tags.SLURM_JOB] == job
