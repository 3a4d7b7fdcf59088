"""On a real NVIDIA GPU: the devices jobs see, the memory the trace records, jobs sharing a GPU,
``jobs_per_gpu=auto`` packing and backing off, a fixed count that does not fit, the MPS daemon
of ``mps=on``, and a DDP job on CUDA.

Each sweep is ``tests/apps/gpu_app.py -m`` through the real Hydra CLI on ``gpus=[0]``, every
job recorded into the test's own sqlite store. When jobs ran at once is read from the tasks'
own clocks (``attempts.jsonl``): run_data.csv's end is when the launcher took a job's end in,
a few ms after the next job on that slot may have begun. Runs only where NVML lists a GPU
(``pytest -m gpu``; CI deselects the mark).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.sweep_reading import (
    Attempt,
    JobRun,
    at_a_time,
    read_attempts,
    read_job_runs,
    read_packing,
    trace_peak_mib,
)
from furcate_hydra.execution.gpu.devices import NvmlProbe
from hydra_plugins.furcate_launcher.config import FurcateLauncherConf
from tests.conftest import APPS, run_cli
from tests.process_helpers import still_alive

GPUS = NvmlProbe().device_ids()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU on this machine (NVML lists none)"),
    pytest.mark.usefixtures("mlflow_store"),
]

LAUNCHER_OPTIONS = {f.name for f in fields(FurcateLauncherConf)}
# auto on its own; MPS (hydra.launcher.mps=auto would start it here) is tested apart
AUTO = ["hydra.launcher.jobs_per_gpu=auto"] + (
    ["hydra.launcher.mps=off"] if "mps" in LAUNCHER_OPTIONS else []
)
MPS_PROCESSES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def sweep(tmp_path: Path, *overrides: str, jobs: int, timeout: float = 240) -> str:
    """``gpu_app.py -m <overrides>`` on GPU 0; checks that all ``jobs`` finished; its output."""
    result = run_cli(
        APPS / "gpu_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        cwd=tmp_path,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    runs = job_runs(tmp_path)
    assert [r.status for r in runs] == ["FINISHED"] * jobs, output[-6000:]
    return output


def job_runs(tmp_path: Path) -> list[JobRun]:
    return read_job_runs(tmp_path / "sweep")


def seen_by_jobs(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads((r.output_dir / "gpu.json").read_text()) for r in job_runs(tmp_path)]


def attempts(tmp_path: Path) -> list[Attempt]:
    return [a for r in job_runs(tmp_path) for a in read_attempts(r.output_dir)]


def only_gpu(tmp_path: Path) -> dict[str, Any]:
    """The figures of gpu_packing.json for the one GPU the sweep used."""
    packing = read_packing(tmp_path / "sweep")
    assert packing is not None, "the auto sweep wrote no gpu_packing.json"
    (figures,) = packing.values()
    return figures


def nvml_uuid(index: int) -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        return str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
    finally:
        pynvml.nvmlShutdown()


def test_nvml_probe_lists_the_gpus_nvidia_smi_lists() -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    expected = re.findall(r"^GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)", listed, re.MULTILINE)
    assert expected, f"nvidia-smi -L listed no GPU:\n{listed}"
    installed = NvmlProbe().installed()
    assert installed is not None
    assert [(gpu.index, gpu.uuid) for gpu in installed] == expected


def test_a_job_on_gpu_0_sees_gpu_0_alone_in_pci_bus_order(tmp_path: Path) -> None:
    sweep(tmp_path, "mode=env", jobs=1)
    (seen,) = seen_by_jobs(tmp_path)
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["device_count"] == 1
    assert seen["uuid"] == nvml_uuid(0)


def test_the_trace_records_the_gpu_memory_a_job_holds(tmp_path: Path) -> None:
    sweep(tmp_path, "mode=hold", "start_gib=1.0", "gib=1.0", "hold_s=3", jobs=1)
    (run,) = job_runs(tmp_path)
    peak = trace_peak_mib(run.output_dir)
    assert peak is not None and peak >= 1000, (run.output_dir / "trace.csv").read_text()
    assert run.gpu_mem_peak_mb is not None and run.gpu_mem_peak_mb >= 1000


def test_two_jobs_per_gpu_run_on_gpu_0_at_the_same_time(tmp_path: Path) -> None:
    sweep(tmp_path, "mode=hold", "i=0,1", "hold_s=4", "hydra.launcher.jobs_per_gpu=2", jobs=2)
    seen = seen_by_jobs(tmp_path)
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["0", "0"]
    assert len({s["FURCATE_SLOT"] for s in seen}) == 2
    assert at_a_time((a.started_at, a.ended_at) for a in attempts(tmp_path)) == 2
    runs = job_runs(tmp_path)
    assert max(r.start or 0 for r in runs) < min(r.end or 0 for r in runs)


def test_auto_runs_more_than_one_small_job_at_a_time(tmp_path: Path) -> None:
    overrides = ["mode=hold", "i=range(0,8)", "gib=0.25", "hold_s=4"]
    sweep(tmp_path, *overrides, *AUTO, "hydra.launcher.max_jobs_per_gpu=4", jobs=8)
    figures = only_gpu(tmp_path)
    assert figures["max_reached"] > 1, figures
    assert figures["oom_backoffs"] == 0, figures
    assert at_a_time((a.started_at, a.ended_at) for a in attempts(tmp_path)) > 1
    assert {s["CUDA_VISIBLE_DEVICES"] for s in seen_by_jobs(tmp_path)} == {"0"}


@pytest.mark.timeout(180)
def test_auto_learns_jobs_of_a_few_seconds_whatever_the_trace_interval(tmp_path: Path) -> None:
    # the trace samples every 10 s; auto reads the GPU twice a second on its own
    overrides = ["mode=hold", "i=range(0,8)", "gib=0.25", "hold_s=3"]
    limits = ["hydra.launcher.max_jobs_per_gpu=4", "hydra.launcher.trace_interval_s=10"]
    sweep(tmp_path, *overrides, *limits, *AUTO, jobs=8)
    figures = only_gpu(tmp_path)
    assert figures["peak_gib_per_job"] > 0.25, figures  # the tensor and the CUDA context
    assert figures["max_reached"] > 1, figures


@pytest.mark.timeout(240)
def test_a_fixed_count_that_does_not_fit_loses_no_job(tmp_path: Path) -> None:
    # 4 at a time by the user's count, each job 30 % of the GPU: the 4th runs out of memory,
    # is queued again, and the GPU runs 3 at a time from then on
    overrides = ["mode=hold", "i=range(0,8)", "fraction=0.3", "hold_s=4"]
    fixed = ["hydra.launcher.jobs_per_gpu=4", "hydra.launcher.mps=off"]
    output = sweep(tmp_path, *overrides, *fixed, jobs=8)
    tried = attempts(tmp_path)
    assert any(a.outcome == "oom" for a in tried), "no job ran out of GPU memory"
    assert "for the rest of the sweep" in output
    figures = only_gpu(tmp_path)
    assert figures["oom_backoffs"] >= 1 and figures["jobs_at_a_time"] <= 3, figures


@pytest.mark.timeout(420)
def test_auto_backs_off_when_jobs_outgrow_the_gpu(tmp_path: Path) -> None:
    # job 0 is small and short, so auto opens its 3 slots; the others hold 0.25 GiB for 8 s
    # (what auto measures first), then 40 % of the GPU for 12 s: a third of those cannot fit
    overrides = ["mode=hold", "i=range(0,6)", "small_jobs=1", "ramp_s=8", "fraction=0.4"]
    limits = ["hold_s=12", "hydra.launcher.max_jobs_per_gpu=3"]
    sweep(tmp_path, *overrides, *limits, *AUTO, jobs=6, timeout=400)
    tried = attempts(tmp_path)
    ran_out = [a for a in tried if a.outcome == "oom"]
    most = at_a_time((a.started_at, a.ended_at) for a in tried)
    assert ran_out, f"no job ran out of GPU memory: auto ran at most {most} of them at once"
    figures = only_gpu(tmp_path)
    assert figures["oom_backoffs"] >= 1, figures
    assert figures["jobs_at_a_time"] <= 2, figures
    # once the launcher has taken the last out-of-memory end in, no third job runs beside two
    settled = max(a.ended_at for a in ran_out) + 1.0
    assert at_a_time(((a.started_at, a.ended_at) for a in tried), after=settled) <= 2


def mps_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.process_iter(["name", "create_time"]) if p.info["name"] in MPS_PROCESSES
    ]


def test_mps_on_serves_jobs_sharing_a_gpu_and_stops_with_the_sweep(tmp_path: Path) -> None:
    assert "mps" in LAUNCHER_OPTIONS, "hydra.launcher.mps is not an option of this launcher"
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH: the driver's MPS tools are missing")
    running = [p.pid for p in mps_processes() if p.info["name"] == MPS_PROCESSES[0]]
    if running:
        pytest.skip(f"an MPS control daemon already runs (pid {running}): ours is not told apart")
    began = time.time()
    overrides = ["hydra.launcher.jobs_per_gpu=2", "hydra.launcher.mps=on"]
    output = sweep(tmp_path, "mode=mps", "i=0,1", "hold_s=3", *overrides, jobs=2)
    assert re.search(r"\bMPS\b[^\n]*\bstart", output, re.IGNORECASE), output[-6000:]
    asked = [s["mps"] for s in seen_by_jobs(tmp_path)]
    assert all(a["returncode"] == 0 for a in asked), asked
    servers = {int(pid) for a in asked for pid in a["server_list"] if pid.isdigit()}
    assert servers, f"the MPS daemon listed no server while the jobs held a context: {asked}"
    pipes = {s["CUDA_MPS_PIPE_DIRECTORY"] for s in seen_by_jobs(tmp_path)}
    assert len(pipes) == 1, pipes  # both jobs were clients of one daemon
    assert still_alive(sorted(servers)) == []
    left = [p.pid for p in mps_processes() if p.info["create_time"] >= began - 1]
    assert still_alive(left) == [], "the sweep's MPS daemon outlived it"


@pytest.mark.timeout(150)
def test_a_ddp_job_trains_on_the_gpu_through_the_same_path(tmp_path: Path) -> None:
    # one GPU: strategy=ddp with devices=1, the launcher's rank path and Lightning's on CUDA
    result = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp",
        "trainer.accelerator=gpu",
        "trainer.devices=1",
        "lr=0.05,0.1",
        "hydra.launcher.gpus=[0]",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        timeout=140,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert [r.status for r in job_runs(tmp_path)] == ["FINISHED"] * 2, output[-6000:]
