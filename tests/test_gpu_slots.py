"""On a real GPU machine: every job sees and uses exactly its slot's GPU.

Runs only where NVML finds a GPU (`pytest -m gpu`); elsewhere the slot logic is covered with
explicit device ids.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.utils import JobStatus

from furcate_hydra.execution.gpu.devices import NvmlProbe
from tests.conftest import LaunchJobs

pytestmark = pytest.mark.gpu

GPUS = NvmlProbe().device_ids()


@pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU on this machine")
def test_each_job_uses_only_its_slots_gpu(launch_jobs: LaunchJobs, tmp_path: Path) -> None:
    jobs = [["mode=cuda", f"+i={i}"] for i in range(2 * len(GPUS))]
    returns = launch_jobs(jobs, ["hydra.launcher.preload=[torch]", "hydra.launcher.jobs_per_gpu=2"])
    seen: dict[str, set[str]] = {}
    for job_return in returns:
        assert job_return.status is JobStatus.COMPLETED, job_return._return_value
        value = job_return.return_value
        assert value["device_count"] == 1
        assert value["sum"] == 1024.0
        seen.setdefault(value["cuda_visible_devices"], set()).add(value["uuid"])
    # every GPU was used, and one slot id always meant the same physical device
    assert sorted(seen) == sorted(GPUS)
    assert all(len(uuids) == 1 for uuids in seen.values())
    assert len({uuid for uuids in seen.values() for uuid in uuids}) == len(GPUS)
