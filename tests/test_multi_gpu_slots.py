"""Slots of several GPUs (``hydra.launcher.gpus_per_job``): planned on declared GPUs (no GPU
here), on a Slurm allocation's GPUs, on a Ray cluster's resources (fake ``ray`` objects), the
job's trace over its GPUs, and one real CLI sweep whose jobs record what they saw."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.launching.backends import plan_for
from furcate_hydra.layout import JobPaths
from furcate_hydra.ray_backend.cluster import plan_ray_slots
from furcate_hydra.ray_backend.options import RayOptions
from furcate_hydra.tracing import ResourceTracer
from furcate_hydra.tracing.gpu import GpuUsage
from furcate_hydra.tracing.samples import read_trace
from tests.conftest import run_probe_sweep
from tests.option_helpers import parse_launcher_options
from tests.test_slots import FakeProbe, devices, plan


def test_eight_gpus_at_two_per_job_are_four_slots_of_a_pair_each() -> None:
    p = plan(gpus=list(range(8)), gpus_per_job=2)
    assert devices(p) == ["0,1", "2,3", "4,5", "6,7"]
    assert [slot.devices for slot in p.slots][1] == ("2", "3")
    env = p.slots[1].env()
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["FURCATE_GPUS_PER_JOB"] == "2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert p.describe() == (
        "4 slots on GPUs 0,1 2,3 4,5 6,7 (2 GPUs per job, from hydra.launcher.gpus)"
    )


def test_gpus_nvml_lists_are_grouped_in_its_order() -> None:
    p = plan(FakeProbe(["0", "1", "2", "3"]), gpus_per_job=2)
    assert devices(p) == ["0,1", "2,3"] and p.source == "NVML"


def test_gpus_left_over_are_named_and_unused() -> None:
    p = plan(gpus=[0, 1, 2, 3, 4], gpus_per_job=2)
    assert devices(p) == ["0,1", "2,3"]
    assert p.describe().endswith("(2 GPUs per job; GPU 4 unused, from hydra.launcher.gpus)")
    assert devices(plan(gpus=list(range(8)), gpus_per_job=3)) == ["0,1,2", "3,4,5"]
    assert "GPUs 6,7 unused" in plan(gpus=list(range(8)), gpus_per_job=3).describe()


def test_max_workers_caps_the_groups() -> None:
    assert devices(plan(gpus=list(range(8)), gpus_per_job=2, max_workers=3)) == [
        "0,1",
        "2,3",
        "4,5",
    ]


def test_fewer_gpus_than_one_job_needs_is_refused_naming_how_many_there_are() -> None:
    with pytest.raises(FurcateConfigError) as raised:
        plan(gpus=[0, 1, 2], gpus_per_job=4)
    error = raised.value
    assert error.key == "hydra.launcher.gpus_per_job" and error.value == 4
    assert "only 3 (0,1,2, from hydra.launcher.gpus)" in error.problem
    assert "at most 3" in error.fix
    with pytest.raises(FurcateConfigError) as raised:
        plan(environ={"CUDA_VISIBLE_DEVICES": "5"}, gpus_per_job=2)
    assert "only 1 (5, from CUDA_VISIBLE_DEVICES='5')" in raised.value.problem


def test_mig_instances_cannot_make_a_job_of_several_gpus() -> None:
    mig = "MIG-3b5b1d6e-0f4e-5b45-a1c0-1f2e3d4c5b6a"
    with pytest.raises(FurcateConfigError) as raised:
        plan(gpus=[mig, "GPU-x"], gpus_per_job=2)
    assert raised.value.key == "hydra.launcher.gpus_per_job" and "MIG" in raised.value.problem


def test_a_jobs_pinned_cores_are_shared_by_its_ranks() -> None:
    p = plan(gpus=[0, 1, 2, 3], gpus_per_job=2, cpus_per_job=4, cpus=list(range(8)))
    assert [slot.cpus for slot in p.slots] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert {slot.threads for slot in p.slots} == {2}  # 4 cores for 2 ranks: 2 threads each
    assert p.slots[0].env()["OMP_NUM_THREADS"] == "2"
    assert p.describe().endswith("4 pinned cores each")


def test_on_cpu_slots_gpus_per_job_is_left_aside_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        p = plan(gpus=[], gpus_per_job=2, cpus=[0, 1])
    assert p.on_cpu and len(p.slots) == 2
    assert all(slot.env()["FURCATE_GPUS_PER_JOB"] == "0" for slot in p.slots)
    assert "gpus_per_job=2 left aside: the jobs run on CPU slots" in caplog.text


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"jobs_per_gpu": 2}, "jobs_per_gpu=2"),
        ({"jobs_per_gpu": "auto"}, "jobs_per_gpu='auto'"),
        ({"gpu_mem_per_job_gb": 8.0}, "gpu_mem_per_job_gb=8.0"),
    ],
)
def test_sharing_a_gpu_and_several_gpus_per_job_are_refused(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        parse_launcher_options({"gpus_per_job": 2, **options})
    error = raised.value
    assert (error.key, error.value) == ("hydra.launcher.gpus_per_job", 2)
    assert named in error.problem and "null" in error.fix


def test_mps_on_is_refused_for_jobs_that_share_no_gpu() -> None:
    with pytest.raises(FurcateConfigError) as raised:
        parse_launcher_options({"gpus_per_job": 2, "mps": "on"})
    assert (raised.value.key, raised.value.value) == ("hydra.launcher.mps", "on")
    assert "its GPUs to itself" in raised.value.problem and "mps=auto" in raised.value.fix
    # one job per GPU, said explicitly, goes with it
    assert parse_launcher_options({"gpus_per_job": 2, "jobs_per_gpu": 1}).slots.gpus_per_job == 2


def test_a_slurm_allocations_gpus_and_cores_make_slots_of_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Slurm sets node-wide ids for an allocation of 4 GPUs; the launcher plans from them and
    # splits the allocation's cores between its slots (plan_for, as a session in Slurm does)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    options = parse_launcher_options({"gpus_per_job": 2})
    p = plan_for(options, cpus=list(range(8)))
    assert devices(p) == ["4,5", "6,7"] and p.source == "CUDA_VISIBLE_DEVICES"
    assert [slot.cpus for slot in p.slots] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert {slot.threads for slot in p.slots} == {2}
    assert p.slots[0].env()["CUDA_VISIBLE_DEVICES"] == "4,5"


class FakeCluster:
    """What ``plan_ray_slots`` asks of the ``ray`` module, with each node's GPUs."""

    def __init__(self, node_gpus: Sequence[int], cpus: float = 64) -> None:
        self.node_gpus = node_gpus
        self.cpus = cpus

    def cluster_resources(self) -> dict[str, float]:
        return {"GPU": float(sum(self.node_gpus)), "CPU": self.cpus}

    def nodes(self) -> list[dict[str, Any]]:
        return [{"Alive": True, "Resources": {"GPU": float(n)}} for n in self.node_gpus]


def test_ray_slots_ask_for_whole_gpus_of_one_node() -> None:
    options = parse_launcher_options({"gpus_per_job": 2, "cpus_per_job": 4}).slots
    ray_plan = plan_ray_slots(options, RayOptions(), FakeCluster([4, 3]))
    # 4 + 3 GPUs, but a job's GPUs are on one node: 2 slots there, 1 here
    assert len(ray_plan.slots) == 3 and ray_plan.gpus_per_slot == 2.0
    assert {slot.threads for slot in ray_plan.slots} == {2}
    assert ray_plan.describe().startswith("3 Ray slots (2 GPUs, 4 CPU each) on 2 nodes")


def test_ray_without_a_node_of_enough_gpus_is_refused() -> None:
    options = parse_launcher_options({"gpus_per_job": 4}).slots
    with pytest.raises(FurcateConfigError) as raised:
        plan_ray_slots(options, RayOptions(), FakeCluster([2, 2]))
    assert raised.value.key == "hydra.launcher.gpus_per_job"
    assert "GPUs per node: 2, 2" in raised.value.problem and "at most 2" in raised.value.fix


class TwoGpus:
    """A GPU sampler (NVML's seam) where the job holds 300 MiB on GPU 0 and 500 on GPU 1."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def usage(self, device: str, pids: Sequence[int]) -> GpuUsage:
        self.read.append(device)
        return {"0": GpuUsage(300.0, 40.0), "1": GpuUsage(500.0, 60.0)}[device]

    def close(self) -> None:
        pass


def test_the_trace_sums_a_jobs_memory_over_its_gpus(tmp_path: Path) -> None:
    gpus = TwoGpus()
    tracer = ResourceTracer(0.1, None, gpu=gpus)
    paths = JobPaths.of(tmp_path / "job")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    tracer.start("1", job.pid, time.time(), device="0,1", paths=paths, run_id=None, title="j")
    job.wait()
    peaks = tracer.end("1")
    tracer.close()
    assert peaks is not None
    assert (peaks.gpu_mem_mb, peaks.gpu_util_percent) == (800.0, 50.0)  # sum; mean
    assert {s.gpu_mem_mb for s in read_trace(paths.trace)} == {800.0}
    assert set(gpus.read) == {"0", "1"}


def _probes(sweep: Path) -> list[Mapping[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(sweep.glob("*/probe.json"))]


@pytest.mark.usefixtures("mlflow_store")
def test_a_sweep_gives_each_job_its_own_pair_of_gpus(tmp_path: Path) -> None:
    result = run_probe_sweep(
        tmp_path,
        "+i=0,1",
        "sleep=1.0",
        "hydra.launcher.gpus=[0,1,2,3]",
        "hydra.launcher.gpus_per_job=2",
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "2 slots on GPUs 0,1 2,3 (2 GPUs per job" in output, output
    assert "MPS" not in output  # mps=auto: no GPU is shared, nothing to start or say
    probes = _probes(tmp_path / "sweep")
    assert len(probes) == 2
    pairs = [set(probe["cuda_visible_devices"].split(",")) for probe in probes]
    assert all(len(pair) == 2 for pair in pairs) and not pairs[0] & pairs[1]
    assert pairs[0] | pairs[1] == {"0", "1", "2", "3"}
    assert {probe["gpus_per_job"] for probe in probes} == {"2"}
    # side by side: each job started before the other ended
    first, second = sorted(probes, key=lambda probe: probe["started_at"])
    assert second["started_at"] < first["ended_at"]


@pytest.mark.parametrize(
    ("arguments", "slot", "refused"),
    [
        ({"accelerator": "gpu", "devices": 4}, "1", True),
        ({"accelerator": "cuda", "devices": [0, 1]}, "1", True),
        ({"accelerator": "auto", "devices": "2"}, "1", True),
        ({"devices": 2}, "1", True),  # accelerator auto: GPUs on a GPU slot
        ({"accelerator": "gpu", "devices": 2}, "2", False),
        ({"accelerator": "gpu", "devices": -1}, "1", False),  # all there are
        ({"accelerator": "gpu", "devices": "auto"}, "1", False),
        ({"accelerator": "cpu", "devices": 4}, "1", False),  # CPU ranks
        ({"accelerator": "gpu", "devices": 4}, "0", False),  # a CPU slot: Lightning says it
        ({"accelerator": "gpu", "devices": 4}, None, False),  # not under the launcher
    ],
)
def test_a_trainer_asking_more_gpus_than_its_slot_has_is_told_to_set_gpus_per_job(
    arguments: dict[str, Any], slot: str | None, refused: bool
) -> None:
    from furcate_hydra.lightning._slot_devices import check_trainer_devices

    environ = {} if slot is None else {"FURCATE_GPUS_PER_JOB": slot}
    if not refused:
        check_trainer_devices(arguments, environ)
        return
    with pytest.raises(FurcateConfigError) as raised:
        check_trainer_devices(arguments, environ)
    message = str(raised.value)
    assert "hydra.launcher.gpus_per_job" in message and "has 1" in message
    assert "set hydra.launcher.gpus_per_job=" in message
