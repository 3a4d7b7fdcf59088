"""hydra.launcher.mps through the real CLI: a daemon (a fake nvidia-cuda-mps-control, real
processes) for GPUs that run several jobs, its jobs pointed at it, gone when the sweep ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from furcate_hydra.execution.gpu.mps import START_TIMEOUT_S
from tests.process_helpers import alive
from tests.test_gpu_packing_sweeps import fake_gpus, sweep

FAKE_BINARY = Path(__file__).parent / "fakes" / "nvidia-cuda-mps-control"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Two fake GPUs, the fake MPS binary first on PATH, no daemon of the user's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FAKE_BINARY, bin_dir / FAKE_BINARY.name)
    environ = fake_gpus(tmp_path, 8, 8)
    environ = {k: v for k, v in environ.items() if not k.startswith("CUDA_MPS_")}
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    return environ


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A dir whose path leaves room for MPS's sockets (pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def jobs_pipe_dirs(tmp_path: Path) -> set[str]:
    """The CUDA_MPS_PIPE_DIRECTORY each job saw ("none" where unset)."""
    lines = (tmp_path / "nvml" / "events.log").read_text().splitlines()
    return {line.split()[5] for line in lines}


def our_daemons(pipe: Path) -> list[psutil.Process]:
    """Processes of the fake binary this test's sweep started (by their pipe dir's env)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(FAKE_BINARY.name in part for part in cmdline):
            try:
                if process.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe):
                    found.append(process)
            except psutil.Error:
                continue
    return found


def test_several_jobs_per_gpu_run_under_a_daemon_the_sweep_starts_and_stops(
    tmp_path: Path, env: dict[str, str]
) -> None:
    code, out = sweep(
        tmp_path,
        env,
        "x=range(0,4)",
        "steps=[[0.5,0.5]]",
        "hydra.launcher.jobs_per_gpu=2",
        "hydra.launcher.gpus=[1]",
    )
    assert code == 0, out
    assert "furcate: MPS" in out and "MPS off" not in out
    pipes = set()
    for line in (tmp_path / "nvml" / "events.log").read_text().splitlines():
        _, _, visible, _, _, mps = line.split()
        # the daemon sees GPU 1 only, as its device 0: the job names it so
        assert visible == "0"
        pipes.add(Path(mps))
    (pipe,) = pipes
    # in the sweep dir, or (a socket path there would be too long) a short temporary dir
    assert pipe == tmp_path / "sweep" / ".mps" / "pipe" or pipe.name.startswith("furcate-mps-")
    assert str(pipe) in out  # the line says where
    assert (tmp_path / "sweep" / ".mps" / "log" / "control.log").exists()
    assert not our_daemons(pipe)  # stopped with the sweep
    assert not (pipe / "control").exists()


def test_mps_on_where_it_cannot_run_stops_before_any_job(tmp_path: Path) -> None:
    environ = fake_gpus(tmp_path, 8)
    environ["PATH"] = str(Path(sys.executable).parent)  # no nvidia-cuda-mps-control there
    code, out = sweep(
        tmp_path, environ, "x=0,1", "hydra.launcher.jobs_per_gpu=2", "hydra.launcher.mps=on"
    )
    assert code != 0
    assert "hydra.launcher.mps" in out and "nvidia-cuda-mps-control is not on PATH" in out
    assert "hydra.launcher.mps=auto or off" in out
    assert not (tmp_path / "nvml" / "events.log").exists()  # no job ran


def test_a_fault_the_mps_server_logs_is_said_with_the_gpu_and_the_jobs_it_may_take(
    tmp_path: Path, env: dict[str, str]
) -> None:
    code, out = sweep(
        tmp_path,
        env,
        "x=0",
        "hydra.launcher.jobs_per_gpu=2",
        "hydra.launcher.gpus=[1]",
        "mps_fault='Client (pid 4242) hit a fatal GPU exception on device 0 (Xid 31)'",
    )
    assert code != 0
    assert "reported a fault" in out and "on GPU 1" in out  # the daemon's device 0 is GPU 1
    assert "jobs on that GPU may have failed with it" in out


def test_a_daemon_the_user_started_is_used_by_the_jobs_and_left_running(
    tmp_path: Path, short_dir: Path, env: dict[str, str]
) -> None:
    pipe = short_dir / "user-pipe"
    env = {**env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    started = subprocess.run([FAKE_BINARY.name, "-d"], env=env, capture_output=True, timeout=30)
    assert started.returncode == 0, started.stderr
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    try:
        code, out = sweep(
            tmp_path, env, "x=0,1", "hydra.launcher.jobs_per_gpu=2", "hydra.launcher.gpus=[1]"
        )
        assert code == 0, out
        assert f"furcate: MPS: using the daemon already running (pipe dir {pipe})" in out
        assert jobs_pipe_dirs(tmp_path) == {str(pipe)}
        assert not (tmp_path / "sweep" / ".mps").exists()  # furcate started none
        assert alive(pid) and "Cmd:quit" not in (pipe / "control.log").read_text()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_auto_where_the_daemon_never_answers_costs_the_sweep_seconds_and_runs_its_jobs(
    tmp_path: Path, env: dict[str, str]
) -> None:
    overrides = ("x=0,1", "hydra.launcher.jobs_per_gpu=2", "hydra.launcher.gpus=[1]")
    took = {}
    for mode in ("off", "auto"):
        where = tmp_path / mode
        where.mkdir()
        hung = {**env, "FAKE_MPS_NEVER_READY": "1"}  # the fake GPUs of tmp_path / "nvml"
        began = time.monotonic()
        code, out = sweep(where, hung, *overrides, f"hydra.launcher.mps={mode}")
        took[mode] = time.monotonic() - began
        assert code == 0, out
    wait = START_TIMEOUT_S["auto"]
    said = "furcate: MPS off: the MPS control daemon did not start: it did not answer within"
    assert f"{said} {wait:g} s" in out
    assert jobs_pipe_dirs(tmp_path) == {"none"}  # both sweeps' jobs time-sliced
    assert not our_daemons(tmp_path / "auto" / "sweep" / ".mps" / "pipe")
    assert took["auto"] - took["off"] < wait + 3.0, took
