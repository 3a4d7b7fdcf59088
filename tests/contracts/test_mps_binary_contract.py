"""What furcate expects of ``nvidia-cuda-mps-control``, held against both it meets: the fake in
``tests/fakes``, which every MPS test without a GPU runs against, and NVIDIA's own binary
(``gpu``; skipped where it is not on PATH or NVML lists no GPU). One contract for the two, so
that the fake cannot drift from the real one unseen, as it once did: the fake listened on a
SOCK_STREAM socket, the real daemon on SOCK_SEQPACKET, and every MPS test passed while
``mps=on`` failed on an H200.

    -f          with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, a daemon in the
                foreground whose ``control`` socket takes a SOCK_SEQPACKET connect and refuses
                a SOCK_STREAM one (EPROTOTYPE); control.log appears in the log dir
    client      ``get_server_list`` on its stdin exits 0 while the daemon runs; ``quit`` stops
                the daemon (its process exits); with no daemon the client exits non-zero
    -d          the daemon in the background, its pid in the pipe dir's
                nvidia-cuda-mps-control.pid; ``quit`` stops it
    furcate     ``control_answers`` and ``daemon_answers`` say True while it runs, False after

NVIDIA documents -d, -f, the client's commands, the pid file and control.log (the MPS guide's
tools reference and logging appendix); the socket's type is what the H200 showed. Every daemon
a test starts is stopped by its pid at the test's end, ``quit`` first, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from furcate_hydra.execution.gpu.devices import NvmlProbe
from furcate_hydra.execution.gpu.mps import BINARY
from furcate_hydra.execution.gpu.mps_watch import control_answers, daemon_answers

FAKE = Path(__file__).resolve().parents[1] / "fakes" / BINARY
REAL = shutil.which(BINARY)
GPUS = NvmlProbe().device_ids() if REAL else []
CLIENT_S = 15.0  # a client that has not ended by then breaks the contract (it must not hang)
START_S = 30.0

pytestmark = pytest.mark.timeout(60)  # each case, the real binary's above all

IMPLEMENTATIONS = [
    pytest.param(str(FAKE), id="fake"),
    pytest.param(
        REAL,
        id="nvidia",
        marks=[
            pytest.mark.gpu,
            pytest.mark.timeout(60),
            pytest.mark.skipif(
                REAL is None or not GPUS,
                reason=f"{BINARY} is not on PATH or NVML lists no GPU",
            ),
        ],
    ),
]


@dataclass(frozen=True)
class Daemon:
    """A daemon a test started: its binary, dirs, environment and (with -f) its process."""

    binary: str
    pipe_dir: Path
    log_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def control(self) -> Path:
        return self.pipe_dir / "control"

    def client(self, *commands: str) -> subprocess.CompletedProcess[bytes]:
        """``echo <commands> | nvidia-cuda-mps-control`` in the daemon's environment."""
        return subprocess.run(
            [self.binary],
            input="".join(f"{command}\n" for command in commands).encode(),
            env=self.env,
            capture_output=True,
            timeout=CLIENT_S,
            check=False,
        )


@pytest.fixture(params=IMPLEMENTATIONS)
def binary(request: pytest.FixtureRequest) -> str:
    assert isinstance(request.param, str)
    return request.param


@pytest.fixture
def dirs(binary: str) -> Iterator[Daemon]:
    """A pipe dir and a log dir of this test's (short paths: room for MPS's sockets), and the
    environment that names them; nothing started yet."""
    root = Path(tempfile.mkdtemp(prefix="fm-contract-", dir="/tmp"))
    pipe_dir, log_dir = root / "pipe", root / "log"
    pipe_dir.mkdir()
    log_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env |= {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    try:
        yield Daemon(binary, pipe_dir, log_dir, env)
    finally:
        for pid in daemons_at(pipe_dir):  # any the test left, -d's included
            stop(Daemon(binary, pipe_dir, log_dir, env), pid)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def running(dirs: Daemon) -> Iterator[Daemon]:
    """``nvidia-cuda-mps-control -f`` in its own session, once its socket takes a connect."""
    with open(dirs.log_dir / "foreground.log", "ab") as out:
        process = subprocess.Popen(
            [dirs.binary, "-f"],
            env=dirs.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its MPS servers are in its group: one SIGKILL ends all
        )
    daemon = Daemon(dirs.binary, dirs.pipe_dir, dirs.log_dir, dirs.env, process)
    try:
        wait(lambda: control_answers(daemon.control), "its control socket to take a connect",
             process)  # fmt: skip
        yield daemon
    finally:
        stop(daemon, process.pid)
        process.wait()


def wait(
    condition: Callable[[], bool],
    what: str,
    process: subprocess.Popen[bytes] | None = None,
    timeout_s: float = START_S,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"the daemon exited with status {process.returncode} before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def daemons_at(pipe_dir: Path) -> list[int]:
    """The pids of the control daemons (-f or -d) whose pipe dir is ``pipe_dir``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = process.info["cmdline"] or []
        if not command or not any(part.endswith(BINARY) for part in command[:2]):
            continue
        if not {"-d", "-f"} & set(command):
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe_dir):
                found.append(process.info["pid"])
    return found


def stop(daemon: Daemon, pid: int) -> None:
    """``quit``, then SIGKILL of ``pid``'s process group where it has not ended in 10 s."""
    if not alive(pid):
        return
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        daemon.client("quit")
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        group = os.getpgid(pid)
        if group == pid:  # its own group (its MPS servers in it), never this test's
            os.killpg(group, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)


def test_its_control_socket_takes_seqpacket_and_refuses_stream(running: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as seqpacket:
        seqpacket.settimeout(5)
        seqpacket.connect(str(running.control))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stream:
        stream.settimeout(5)
        with pytest.raises(OSError) as refused:
            stream.connect(str(running.control))
    assert refused.value.errno == errno.EPROTOTYPE


def test_control_log_appears_in_the_log_dir(running: Daemon) -> None:
    wait(lambda: (running.log_dir / "control.log").is_file(), "control.log", running.process)


def test_the_client_gets_an_answer_while_it_runs(running: Daemon) -> None:
    asked = running.client("get_server_list")
    assert asked.returncode == 0, asked.stderr
    assert running.process is not None and running.process.poll() is None


def test_quit_through_the_client_stops_it_then_the_client_fails(running: Daemon) -> None:
    assert running.process is not None
    quit_ = running.client("quit")
    assert quit_.returncode == 0, quit_.stderr
    running.process.wait(timeout=20)
    asked = running.client("get_server_list")
    assert asked.returncode != 0, asked.stdout


def test_furcates_probes_say_true_while_it_runs_and_false_after(running: Daemon) -> None:
    assert control_answers(running.control)
    assert daemon_answers(running.pipe_dir, running.binary, running.env)
    assert running.process is not None
    assert running.client("quit").returncode == 0
    running.process.wait(timeout=20)
    assert not control_answers(running.control)
    assert not daemon_answers(running.pipe_dir, running.binary, running.env)


def test_background_mode_writes_its_pid_and_quit_stops_it(dirs: Daemon) -> None:
    started = subprocess.run(
        [dirs.binary, "-d"], env=dirs.env, capture_output=True, timeout=CLIENT_S, check=False
    )
    assert started.returncode == 0, started.stderr
    pid_file = dirs.pipe_dir / "nvidia-cuda-mps-control.pid"
    wait(pid_file.is_file, "pid file")
    wait(lambda: pid_file.read_text().strip().isdigit(), "pid in the pid file")
    pid = int(pid_file.read_text())
    try:
        assert alive(pid) and daemons_at(dirs.pipe_dir) == [pid]
        wait(lambda: control_answers(dirs.control), "its control socket to take a connect")
        assert dirs.client("get_server_list").returncode == 0
        assert dirs.client("quit").returncode == 0
        wait(lambda: not alive(pid), "exit after quit", timeout_s=20)
    finally:
        stop(dirs, pid)


def test_a_client_without_a_daemon_exits_non_zero(dirs: Daemon) -> None:
    asked = dirs.client("get_server_list")
    assert asked.returncode != 0, asked.stdout


def test_a_stream_server_is_not_taken_for_a_daemon() -> None:
    """The probe furcate had before the H200: a SOCK_STREAM connect took any stream server
    (and refused the real daemon). A SOCK_STREAM server now is no daemon, even where it
    answers as the old fake did."""
    pipe_dir = Path(tempfile.mkdtemp(prefix="fm-stream-", dir="/tmp"))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(pipe_dir / "control"))
            server.listen(8)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as old_probe:
                old_probe.connect(str(pipe_dir / "control"))  # it does listen
            assert not control_answers(pipe_dir / "control")
            assert not daemon_answers(pipe_dir, None)
            assert not daemon_answers(pipe_dir, str(FAKE))
    finally:
        shutil.rmtree(pipe_dir, ignore_errors=True)
