"""Tests for slot planning, driven by a fake GPU probe since this machine has no GPU."""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu.devices import GpuProbe, InstalledGpu
from furcate_hydra.execution.slots import Slot, SlotPlan, plan_slots
from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

GIB = 2**30
UUID_A = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID_B = "GPU-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"
UUIDS = {"0": UUID_A, "1": UUID_B}  # what the fake NVML says GPUs 0 and 1 are


class FakeProbe:
    """A GpuProbe with fixed devices; free memory None means unreadable; ``nvml=False`` means
    NVML is not available, so what is installed is unknown (a machine without a driver)."""

    def __init__(
        self, ids: list[str], free: dict[str, int] | None = None, *, nvml: bool = True
    ) -> None:
        self.ids = ids
        self.free = free
        self.nvml = nvml

    def device_ids(self) -> list[str]:
        return list(self.ids)

    def installed(self) -> list[InstalledGpu] | None:
        if not self.nvml:
            return None
        return [InstalledGpu(device, UUIDS.get(device, f"GPU-{device}")) for device in self.ids]

    def free_memory_bytes(self, device_id: str) -> int:
        if self.free is None:
            raise RuntimeError("NVML is not available")
        return self.free[device_id]


def plan(
    probe: GpuProbe | None = None, environ: dict[str, str] | None = None, **kw: Any
) -> SlotPlan:
    """Plan with no CUDA_VISIBLE_DEVICES, no GPU, no NVML and 8 cores unless told otherwise:
    named GPUs are taken as named, as on a machine without a driver."""
    cpus = kw.pop("cpus", list(range(8)))
    return plan_slots(
        FurcateLauncher.parse_options(kw).slots,
        environ={} if environ is None else environ,
        probe=probe or FakeProbe([], nvml=False),
        available_cpus=cpus,
    )


def devices(p: SlotPlan) -> list[str | None]:
    return [slot.device for slot in p.slots]


def test_explicit_gpus_with_two_jobs_each_interleave() -> None:
    p = plan(gpus=[0, 1, 2], jobs_per_gpu=2)
    assert p.source == "explicit"
    assert not p.on_cpu
    assert devices(p) == ["0", "1", "2", "0", "1", "2"]
    assert Counter(devices(p)) == {"0": 2, "1": 2, "2": 2}
    assert [slot.index for slot in p.slots] == list(range(6))
    assert all(slot.cpus is None and slot.threads is None for slot in p.slots)
    assert p.describe() == "6 slots on GPUs 0,1,2 (2 per GPU, from hydra.launcher.gpus)"


def test_explicit_gpus_as_string_and_uuids() -> None:
    assert devices(plan(gpus=" 1, 0")) == ["1", "0"]
    assert devices(plan(gpus=[UUID_A, "3"])) == [UUID_A, "3"]


def test_explicit_gpus_override_environment_and_probe() -> None:
    p = plan(FakeProbe(["0", "1", "2"]), {"CUDA_VISIBLE_DEVICES": "1"}, gpus=[2])
    assert devices(p) == ["2"]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [([1, 0], ["1", "0"]), ([UUID_B], [UUID_B]), (["GPU-1b2c3d4e"], ["GPU-1b2c3d4e"])],
)
def test_named_gpus_that_nvml_lists_are_used(gpus: list[int | str], expected: list[str]) -> None:
    # by index, by UUID, or by a prefix of a UUID, as CUDA takes them
    assert devices(plan(FakeProbe(["0", "1"]), gpus=gpus)) == expected


@pytest.mark.parametrize(
    ("probe", "environ", "gpus", "key", "missing", "sees"),
    [
        (FakeProbe([]), {}, [0], "hydra.launcher.gpus", "0", "NVML sees no GPU on this machine"),
        (
            FakeProbe(["0", "1"]),
            {},
            [1, 2],
            "hydra.launcher.gpus",
            "2",
            f"NVML sees 2 GPUs: 0 ({UUID_A}), 1 ({UUID_B})",
        ),
        (
            FakeProbe(["0"]),
            {},
            [UUID_B],
            "hydra.launcher.gpus",
            UUID_B,
            f"NVML sees 1 GPU: 0 ({UUID_A})",
        ),
        (
            FakeProbe(["0", "1"]),
            {"CUDA_VISIBLE_DEVICES": "1,3"},
            None,
            "CUDA_VISIBLE_DEVICES",
            "3",
            f"NVML sees 2 GPUs: 0 ({UUID_A}), 1 ({UUID_B})",
        ),
    ],
    ids=["no-gpu", "index", "uuid", "cuda-visible-devices"],
)
def test_a_named_gpu_nvml_does_not_list_is_refused(
    probe: FakeProbe,
    environ: dict[str, str],
    gpus: list[int | str] | None,
    key: str,
    missing: str,
    sees: str,
) -> None:
    with pytest.raises(FurcateConfigError) as info:
        plan(probe, environ, gpus=gpus)
    message = str(info.value)
    assert info.value.key == key
    assert f"GPU {missing} does not exist: {sees}. Fix: " in message
    if gpus is not None:
        assert f"Invalid hydra.launcher.gpus={gpus!r}:" in message


def test_the_fix_for_a_gpu_that_does_not_exist_names_what_nvml_lists() -> None:
    with pytest.raises(FurcateConfigError, match=r"Fix: name GPUs NVML sees, .*gpus=\[0,1\]"):
        plan(FakeProbe(["0", "1"]), gpus=[4])
    with pytest.raises(FurcateConfigError, match=r"Fix: set hydra.launcher.gpus=\[\] to run"):
        plan(FakeProbe([]), gpus=[0])
    with pytest.raises(FurcateConfigError, match="Fix: export CUDA_VISIBLE_DEVICES with GPUs"):
        plan(FakeProbe(["0"]), {"CUDA_VISIBLE_DEVICES": "1"})


def test_without_nvml_named_gpus_are_used_as_named_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="furcate_hydra.execution.slots"):
        p = plan(FakeProbe([], nvml=False), gpus=[0, 1])
    assert devices(p) == ["0", "1"]
    assert p.source == "explicit"
    assert [r.getMessage() for r in caplog.records] == [
        "furcate: cannot check that GPUs 0,1 (hydra.launcher.gpus) exist: NVML is not "
        "available (no NVIDIA driver?); a job whose GPU does not exist runs on CPU"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="furcate_hydra.execution.slots"):
        plan(FakeProbe([], nvml=False), {"CUDA_VISIBLE_DEVICES": "2"})
    assert [r.getMessage() for r in caplog.records] == [
        "furcate: cannot check that GPU 2 (CUDA_VISIBLE_DEVICES) exists: NVML is not "
        "available (no NVIDIA driver?); a job whose GPU does not exist runs on CPU"
    ]


def test_mig_instances_are_taken_as_named() -> None:
    # NVML's list of GPUs does not hold MIG instances: nothing to check them against
    mig = "MIG-7a2e1b1c-3d4e-5f60-7182-93a4b5c6d7e8"
    assert devices(plan(FakeProbe(["0"]), gpus=[mig])) == [mig]


@pytest.mark.parametrize("gpus", [[], ""])
def test_empty_gpus_means_cpu(gpus: list[int] | str) -> None:
    p = plan(FakeProbe(["0"]), gpus=gpus)
    assert p.on_cpu
    assert "hydra.launcher.gpus is empty" in p.describe()


def test_cuda_visible_devices_is_used_before_nvml() -> None:
    p = plan(FakeProbe(["0", "1", "2", "3"]), {"CUDA_VISIBLE_DEVICES": "2, 3"})
    assert p.source == "CUDA_VISIBLE_DEVICES"
    assert devices(p) == ["2", "3"]


def test_cuda_visible_devices_with_uuids() -> None:
    p = plan(environ={"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}, jobs_per_gpu=2)
    assert devices(p) == [UUID_A, UUID_B, UUID_A, UUID_B]
    assert p.slots[1].env()["CUDA_VISIBLE_DEVICES"] == UUID_B


@pytest.mark.parametrize("value", ["", "-1"])
def test_cuda_visible_devices_hiding_every_gpu_means_cpu(value: str) -> None:
    p = plan(FakeProbe(["0", "1"]), {"CUDA_VISIBLE_DEVICES": value})
    assert p.on_cpu
    assert p.source == "cpu"
    assert f"CUDA_VISIBLE_DEVICES={value!r}" in p.describe()


def test_nvml_discovery() -> None:
    p = plan(FakeProbe(["0", "1"]), jobs_per_gpu=2, cpus_per_job=2)
    assert p.source == "NVML"
    assert devices(p) == ["0", "1", "0", "1"]
    assert p.describe() == "4 slots on GPUs 0,1 (2 per GPU, from NVML), 2 pinned cores each"


def test_gpu_memory_sizing_clamps_and_differs_per_gpu() -> None:
    free = {"0": 10 * GIB, "1": 3 * GIB, "2": GIB // 2, "3": 100 * GIB}
    p = plan(FakeProbe(list(free), free), gpu_mem_per_job_gb=2, max_jobs_per_gpu=8)
    # 10/2 = 5; 3/2 floors to 1; 0.5/2 clamps up to 1; 100/2 clamps down to 8.
    assert Counter(devices(p)) == {"0": 5, "1": 1, "2": 1, "3": 8}
    assert devices(p)[:6] == ["0", "1", "2", "3", "0", "3"]
    assert "5/1/1/8 per GPU" in p.describe()


def test_gpu_memory_sizing_accepts_fractional_gib() -> None:
    p = plan(FakeProbe(["0"], {"0": 4 * GIB}), gpu_mem_per_job_gb=1.5)
    assert len(p.slots) == 2


def test_gpu_memory_sizing_without_readable_memory_says_use_jobs_per_gpu() -> None:
    with pytest.raises(FurcateConfigError) as info:
        plan(FakeProbe(["0"], None), gpu_mem_per_job_gb=4)
    message = str(info.value)
    assert "hydra.launcher.gpu_mem_per_job_gb=4" in message
    assert "Fix: set hydra.launcher.jobs_per_gpu instead" in message


def test_max_workers_spreads_the_cap_over_gpus() -> None:
    p = plan(gpus=[0, 1, 2], jobs_per_gpu=4, max_workers=5)
    assert devices(p) == ["0", "1", "2", "0", "1"]
    assert [slot.index for slot in p.slots] == list(range(5))
    assert len(plan(gpus=[0, 1], jobs_per_gpu=2, max_workers=100).slots) == 4


def test_cpus_per_job_gives_distinct_contiguous_blocks() -> None:
    p = plan(gpus=[0, 1], jobs_per_gpu=2, cpus_per_job=2, cpus=[4, 5, 6, 7, 8, 9, 10, 11])
    blocks = [slot.cpus for slot in p.slots]
    assert blocks == [(4, 5), (6, 7), (8, 9), (10, 11)]
    assert all(slot.threads == 2 for slot in p.slots)
    assert p.slots[0].env()["OMP_NUM_THREADS"] == "2"
    assert "shared" not in p.describe()


def test_cpus_per_job_wraps_around_when_cores_run_out() -> None:
    p = plan(gpus=[0, 1, 2], cpus_per_job=2, cpus=[0, 1, 2, 3, 4])
    assert [slot.cpus for slot in p.slots] == [(0, 1), (2, 3), (0, 1)]
    assert "cores shared" in p.describe()


def test_cpu_fallback_uses_every_core_with_one_thread_each() -> None:
    p = plan(cpus=[0, 1, 2, 3])
    assert p.on_cpu
    assert p.source == "cpu"
    assert devices(p) == [None] * 4
    assert all(slot.cpus is None and slot.threads == 1 for slot in p.slots)
    assert p.describe() == "4 CPU slots (no GPU: NVML lists none), 1 thread each"


def test_cpu_fallback_shares_cores_among_fewer_workers() -> None:
    p = plan(cpus=[0, 1, 2, 3, 4], max_workers=2)
    assert [slot.threads for slot in p.slots] == [2, 2]


def test_cpu_fallback_with_cpus_per_job() -> None:
    p = plan(cpus=[0, 1, 2, 3, 4], cpus_per_job=2)
    assert [slot.cpus for slot in p.slots] == [(0, 1), (2, 3)]
    assert [slot.threads for slot in p.slots] == [2, 2]
    assert len(plan(cpus=[0, 1, 2, 3], cpus_per_job=3).slots) == 1


def test_slot_env() -> None:
    gpu = Slot(index=3, device="1", cpus=None, threads=None)
    assert gpu.env() == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FURCATE_SLOT": "3",
        "FURCATE_GPUS_PER_JOB": "1",
    }
    cpu = Slot(index=0, device=None, cpus=(0, 1), threads=2).env()
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["FURCATE_GPUS_PER_JOB"] == "0"
    assert cpu["OMP_NUM_THREADS"] == cpu["MKL_NUM_THREADS"] == cpu["OPENBLAS_NUM_THREADS"] == "2"


@pytest.mark.parametrize(
    ("environ", "gpus", "where"),
    [
        ({}, None, "NVML lists none"),
        ({"CUDA_VISIBLE_DEVICES": ""}, None, "CUDA_VISIBLE_DEVICES=''"),
        ({}, [], "hydra.launcher.gpus is empty"),
    ],
)
def test_no_gpu_without_allow_cpu_is_an_error(
    environ: dict[str, str], gpus: list[int] | None, where: str
) -> None:
    with pytest.raises(FurcateConfigError) as info:
        plan(FakeProbe([]), environ, gpus=gpus, allow_cpu=False)
    message = str(info.value)
    assert "hydra.launcher.allow_cpu=False" in message
    assert f"no GPU was found: {where}" in message
    assert "Fix:" in message
    assert "allow_cpu=true" in message


BAD_OPTIONS: list[tuple[dict[str, Any], str, object]] = [
    ({"gpus": [True]}, "gpus", [True]),
    ({"gpus": [0.0]}, "gpus", [0.0]),
    ({"gpus": [-1]}, "gpus", [-1]),
    ({"gpus": [0, 0]}, "gpus", [0, 0]),
    ({"gpus": [0, "0"]}, "gpus", [0, "0"]),
    ({"gpus": "0,,1"}, "gpus", "0,,1"),
    ({"gpus": "0,"}, "gpus", "0,"),
    ({"gpus": "first"}, "gpus", "first"),
    ({"gpus": ["cuda:0"]}, "gpus", ["cuda:0"]),
    ({"gpus": 0}, "gpus", 0),
    ({"jobs_per_gpu": 0}, "jobs_per_gpu", 0),
    ({"jobs_per_gpu": -2}, "jobs_per_gpu", -2),
    ({"jobs_per_gpu": True}, "jobs_per_gpu", True),
    ({"jobs_per_gpu": 1.5}, "jobs_per_gpu", 1.5),
    ({"max_jobs_per_gpu": 0}, "max_jobs_per_gpu", 0),
    ({"max_workers": 0}, "max_workers", 0),
    ({"max_workers": -1}, "max_workers", -1),
    ({"cpus_per_job": 0}, "cpus_per_job", 0),
    ({"cpus_per_job": False}, "cpus_per_job", False),
    ({"gpu_mem_per_job_gb": 0}, "gpu_mem_per_job_gb", 0),
    ({"gpu_mem_per_job_gb": -1.0}, "gpu_mem_per_job_gb", -1.0),
    ({"gpu_mem_per_job_gb": True}, "gpu_mem_per_job_gb", True),
    ({"gpu_mem_per_job_gb": "4"}, "gpu_mem_per_job_gb", "4"),
    ({"gpu_mem_per_job_gb": math.inf}, "gpu_mem_per_job_gb", math.inf),
    ({"jobs_per_gpu": 2, "gpu_mem_per_job_gb": 4.0}, "jobs_per_gpu", 2),
    ({"allow_cpu": "yes"}, "allow_cpu", "yes"),
    ({"cpus_per_job": 9}, "cpus_per_job", 9),
]


@pytest.mark.parametrize(("options", "option", "value"), BAD_OPTIONS)
def test_bad_options_name_key_value_and_fix(
    options: dict[str, Any], option: str, value: object
) -> None:
    probe = FakeProbe(["0"], {"0": 8 * GIB})
    with pytest.raises(FurcateConfigError) as info:
        plan(probe, **options)
    message = str(info.value)
    assert info.value.key == f"hydra.launcher.{option}"
    assert f"Invalid hydra.launcher.{option}={value!r}:" in message
    assert "Fix:" in message


def test_both_sizing_options_say_pick_one() -> None:
    with pytest.raises(FurcateConfigError, match=r"gpu_mem_per_job_gb=4\.0.*pick one"):
        plan(jobs_per_gpu=2, gpu_mem_per_job_gb=4.0)


def test_cpus_per_job_above_core_count_names_the_cores() -> None:
    with pytest.raises(FurcateConfigError, match=r"only 4 cores.*at most 4"):
        plan(cpus_per_job=6, cpus=[0, 1, 2, 3])


def test_validation_happens_before_discovery() -> None:
    class ExplodingProbe(FakeProbe):
        def device_ids(self) -> list[str]:
            raise AssertionError("probe used before options were validated")

    with pytest.raises(FurcateConfigError, match="max_workers"):
        plan(ExplodingProbe([]), max_workers=0)
