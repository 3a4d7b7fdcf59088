"""Slots through the real CLI: one device per job, never more jobs on a device than asked."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_probe_sweep
from tests.sweeper_helpers import max_overlap

# every test here launches jobs, which record into the test's own store
pytestmark = pytest.mark.usefixtures("mlflow_store")


def _probes(sweep: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(sweep.glob("*/probe.json"))]


def test_jobs_spread_over_explicit_gpus_two_per_gpu(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = run_probe_sweep(
        tmp_path,
        "+i=range(0,12)",
        "sleep=0.8",
        "hydra.launcher.gpus=[0,1,2]",
        "hydra.launcher.jobs_per_gpu=2",
    )
    assert result.returncode == 0, result.stderr
    probes = _probes(sweep)
    assert len(probes) == 12

    by_device: dict[str, list[tuple[float, float]]] = defaultdict(list)
    device_of_slot: dict[str, set[str]] = defaultdict(set)
    for probe in probes:
        device = probe["cuda_visible_devices"]
        assert device in {"0", "1", "2"}, device  # exactly one device, never a list
        by_device[device].append((probe["started_at"], probe["ended_at"]))
        device_of_slot[probe["slot"]].add(device)
        assert probe["sid"] == probe["pid"] == probe["pgid"]  # its own session and group

    assert sorted(device_of_slot) == [str(i) for i in range(6)]  # every slot was used
    assert all(len(devices) == 1 for devices in device_of_slot.values())
    assert {device: max_overlap(spans) for device, spans in by_device.items()} == {
        "0": 2,
        "1": 2,
        "2": 2,
    }
    assert len({probe["pid"] for probe in probes}) == 12
    assert (sweep / "0" / "stdout.log").exists() and (sweep / "0" / "probe_app.log").exists()


def test_cpus_per_job_pins_distinct_cores_and_threads(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = run_probe_sweep(
        tmp_path,
        "+i=range(0,4)",
        "sleep=0.3",
        "hydra.launcher.gpus=[0,1]",
        "hydra.launcher.cpus_per_job=1",
        "hydra.launcher.preload=[torch]",
    )
    assert result.returncode == 0, result.stderr
    probes = _probes(sweep)
    affinity_of_slot = {probe["slot"]: tuple(probe["affinity"]) for probe in probes}
    assert sorted(affinity_of_slot.values()) == [(0,), (1,)]
    for probe in probes:
        assert len(probe["affinity"]) == 1
        assert probe["omp_num_threads"] == "1"
        assert probe["torch_threads"] == 1


def test_cpu_fallback_says_so_and_hides_gpus(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = run_probe_sweep(tmp_path, "+i=0,1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "CPU slots" in result.stdout + result.stderr
    assert {probe["cuda_visible_devices"] for probe in _probes(sweep)} == {""}
