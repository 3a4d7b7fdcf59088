"""jobs_per_gpu=auto end to end: the real CLI, real job processes, GPUs faked through NVML.

NVML's answers come from ``tests/fakes/nvml`` (put first on the launcher's import path); the
jobs (``apps/fake_gpu_app.py``) hold memory there and run out of it as CUDA jobs would, with
torch's own ``OutOfMemoryError``. The slot logic, the trace, the pool and the launcher are the
real ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import APPS, furcate_status, run_cli

FAKE_NVML = Path(__file__).parent / "fakes" / "nvml"


def fake_gpus(tmp_path: Path, *total_gib: float) -> dict[str, str]:
    """GPUs of these sizes, faked; the environment that makes the launcher see them."""
    state = tmp_path / "nvml"
    state.mkdir()
    gpus = [
        {"uuid": f"GPU-{i:08d}-fake-0000-0000-000000000000", "total_mib": gib * 1024}
        for i, gib in enumerate(total_gib)
    ]
    (state / "gpus.json").write_text(json.dumps(gpus))
    path = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "FURCATE_FAKE_NVML": str(state)}


def sweep(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[int, str]:
    """The sweep's exit code and what it printed (stdout and stderr); auto, unless an
    override sets jobs_per_gpu, with up to 8 jobs a GPU (this machine's cores would allow 2),
    on memory alone: these jobs of a second or two run no kernels whose rate could be read."""
    done = run_cli(
        APPS / "fake_gpu_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        # what is tested is the slots, not the record: no MLflow to load (seconds a sweep)
        "hydra.launcher.mlflow.enabled=false",
        "hydra.launcher.jobs_per_gpu=auto",
        "hydra.launcher.max_jobs_per_gpu=8",
        "hydra.launcher.auto_min_gain=0",
        "hydra.launcher.progress=plain",
        *overrides,
        cwd=tmp_path,
        env=env,
    )
    return done.returncode, done.stdout + done.stderr


def most_at_once(tmp_path: Path, gpu: str = "0") -> int:
    """The most jobs that held GPU ``gpu`` at the same time, from the jobs' own log."""
    events = []
    for line in (tmp_path / "nvml" / "events.log").read_text().splitlines():
        what, at, device, *_ = line.split()
        if device == gpu:
            events.append((float(at), 0 if what == "end" else 1))
    running = most = 0
    for _, starts in sorted(events):
        running += 1 if starts else -1
        most = max(most, running)
    return most


def packing(tmp_path: Path) -> dict[str, dict[str, float]]:
    gpus: dict[str, dict[str, float]] = json.loads(
        (tmp_path / "sweep" / "gpu_packing.json").read_text()
    )["gpus"]
    return gpus


def test_a_gpu_opens_slots_as_the_measured_peaks_allow(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 10)
    code, out = sweep(tmp_path, env, "x=range(0,9)", "steps=[[2.0,2.0]]", "hydra.launcher.gpus=[0]")
    assert code == 0, out
    # 2 GiB a job, 0.5 GiB margin, 10 GiB: four at a time (4 x 2 + 2 + 0.5 > 10)
    assert "1 at first, up to 8 as measured memory and throughput allow" in out
    assert packing(tmp_path)["0"]["jobs_at_a_time"] == 4
    assert packing(tmp_path)["0"]["peak_gib_per_job"] == pytest.approx(2.0)
    assert most_at_once(tmp_path) == 4
    line = "GPU 0: 4 at a time, peak 2.0 GiB per job"
    assert line in out  # the summary on the console
    assert line in (tmp_path / "sweep" / "summary.md").read_text()
    assert line in furcate_status(tmp_path / "sweep", cwd=tmp_path, env=env)


def test_out_of_memory_beside_others_backs_off_and_every_job_finishes(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 10)
    # each job holds 1 GiB for 2.5 s (learned: eight fit), then needs 3 GiB (three fit): others run
    # out of memory, are queued again, and the GPU closes slots until what runs fits
    code, out = sweep(
        tmp_path, env, "x=range(0,8)", "steps=[[1.0,2.5],[3.0,1.0]]", "hydra.launcher.gpus=[0]"
    )
    assert code == 0, out
    assert "ran out of GPU memory on GPU 0 beside" in out
    learned = packing(tmp_path)["0"]
    assert learned["oom_backoffs"] >= 1
    assert learned["max_reached"] > 3 >= learned["jobs_at_a_time"]
    assert "8 finished" in out  # none failed, none retried as a crash


def test_out_of_memory_in_a_dataloader_worker_is_backed_off_too(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 4)
    # gpu_mem_per_job_gb=2 starts the 4 GiB GPU at two; both then need 3 GiB: the second
    # runs out in its DataLoader worker, waits, and runs alone
    code, out = sweep(
        tmp_path,
        env,
        "x=range(0,2)",
        "steps=[[1.0,0.6],[3.0,0.6]]",
        "oom_in=worker",
        "hydra.launcher.gpu_mem_per_job_gb=2",
        "hydra.launcher.gpus=[0]",
    )
    assert code == 0, out
    assert "2 at first" in out
    assert "DataLoader worker" in out  # the reason names where it ran out
    learned = packing(tmp_path)["0"]
    # (it opened a third slot while both held 1 GiB: 1 + 1 + 1 + 0.5 fits in 4)
    assert learned["max_reached"] >= 2 and learned["oom_backoffs"] == 1
    assert learned["jobs_at_a_time"] == 1
    assert learned["peak_gib_per_job"] == pytest.approx(3.0)


def test_a_job_out_of_memory_alone_on_its_gpu_fails_with_that_reason(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 4, 4)
    code, out = sweep(tmp_path, env, "x=0,1", "steps=[[5.0,0.2]]", "hydra.launcher.gpus=[0,1]")
    assert code != 0, out
    assert "ran out of GPU memory alone on GPU" in out
    assert "does not fit on this GPU" in (tmp_path / "sweep" / "summary.md").read_text()
    assert "2 failed" in out


def test_auto_without_nvml_is_refused_before_anything_runs(tmp_path: Path) -> None:
    env = {**os.environ, "FURCATE_FAKE_NVML": ""}  # no fake: the real NVML finds no driver
    code, out = sweep(tmp_path, env, "x=0", "hydra.launcher.gpus=[0]")
    assert code != 0, out
    assert "hydra.launcher.jobs_per_gpu" in out
    assert "memory of GPU 0 cannot be read" in out
    assert "set hydra.launcher.jobs_per_gpu to a number" in out
    assert not (tmp_path / "sweep" / "0").exists()  # no job ran


def test_gpus_1_is_the_same_card_for_nvml_the_trace_and_the_job(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 8, 16)
    env["CUDA_DEVICE_ORDER"] = "FASTEST_FIRST"  # the user's; CUDA would number by speed
    code, out = sweep(
        tmp_path,
        env,
        "x=0",
        "steps=[[3.0,1.0]]",
        "hydra.launcher.gpus=[1]",
        "hydra.launcher.trace_interval_s=0.1",
    )
    assert code == 0, out
    events = (tmp_path / "nvml" / "events.log").read_text().split()
    assert events[2] == "1" and events[4] == "PCI_BUS_ID"  # the job's GPU, its order
    assert events[5] == "none"  # one job at a time: no MPS daemon
    assert list(packing(tmp_path)) == ["1"]
    assert packing(tmp_path)["1"]["budget_gib"] == pytest.approx(16.0)  # NVML's card 1
    trace = (tmp_path / "sweep" / "0" / "trace.csv").read_text().splitlines()
    column = trace[0].split(",").index("gpu_mem_mb")
    assert max(float(row.split(",")[column] or 0) for row in trace[1:]) == pytest.approx(3072)


def test_jobs_of_a_few_seconds_are_learned_though_the_trace_samples_every_10_s(
    tmp_path: Path,
) -> None:
    env = fake_gpus(tmp_path, 10)
    code, out = sweep(
        tmp_path,
        env,
        "x=range(0,8)",
        "steps=[[2.0,3.0]]",
        "hydra.launcher.gpus=[0]",
        "hydra.launcher.trace_interval_s=10",  # the trace's; auto reads twice a second
    )
    assert code == 0, out
    learned = packing(tmp_path)["0"]
    assert learned["peak_gib_per_job"] == pytest.approx(2.0)
    assert learned["max_reached"] >= 2 and most_at_once(tmp_path) >= 2
    assert "no job's peak learned yet" not in out


def test_a_fixed_count_queues_a_job_out_of_memory_beside_others_again(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 4)
    # three at a time by the user's count, each needing 1 GiB then 2 GiB of a 4 GiB GPU: the
    # third to reach 2 GiB runs out beside two others, is queued again, and GPU 0 runs two
    code, out = sweep(
        tmp_path,
        env,
        "x=range(0,6)",
        "steps=[[1.0,0.5],[2.0,1.0]]",
        "hydra.launcher.jobs_per_gpu=3",
        "hydra.launcher.gpus=[0]",
    )
    assert code == 0, out
    assert "now runs 2 at a time for the rest of the sweep" in out
    assert "6 finished" in out  # none failed
    learned = packing(tmp_path)["0"]
    assert learned["oom_backoffs"] >= 1 and learned["jobs_at_a_time"] <= 2
    assert "out-of-memory back-off" in (tmp_path / "sweep" / "summary.md").read_text()


def test_a_fixed_count_job_out_of_memory_alone_fails_with_the_reason(tmp_path: Path) -> None:
    env = fake_gpus(tmp_path, 4)
    code, out = sweep(
        tmp_path,
        env,
        "x=0",
        "steps=[[5.0,0.2]]",
        "hydra.launcher.jobs_per_gpu=2",
        "hydra.launcher.gpus=[0]",
    )
    assert code != 0, out
    assert "ran out of GPU memory alone on GPU 0" in out
    assert "1 failed" in out


@pytest.mark.slow
def test_auto_stops_adding_jobs_where_one_more_no_longer_raises_the_steps_per_second(
    tmp_path: Path,
) -> None:
    # memory would let 8 Lightning jobs share the fake 80 GiB GPU, which runs 2 at full speed
    # and time-slices more: their summed steps/s stops growing at 2. A gain asked of 25 %
    # (the 2nd job brings 100 %, a 3rd none) keeps the other tests' load on these cores from
    # passing for one
    env = fake_gpus(tmp_path, 80)
    done = run_cli(
        APPS / "fake_gpu_trainer.py",
        "-m",
        "x=range(0,6)",
        "capacity=2",
        "width=64",
        "step_s=0.05",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.launcher.mlflow.enabled=false",
        "hydra.launcher.gpus=[0]",
        "hydra.launcher.jobs_per_gpu=auto",
        "hydra.launcher.max_jobs_per_gpu=8",
        "hydra.launcher.auto_min_gain=0.25",
        "hydra.launcher.cpus_per_job=1",
        "hydra.launcher.progress=plain",
        cwd=tmp_path,
        env=env,
        timeout=400,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    learned = packing(tmp_path)["0"]
    assert "steps/s" in str(learned["stopped_because"]), learned
    assert learned["jobs_at_a_time"] < learned["max_reached"] <= 4
    assert learned["peak_gib_per_job"] == pytest.approx(0.5)
    assert f"GPU 0: {learned['jobs_at_a_time']} at a time" in out
    assert str(learned["stopped_because"]) in out
