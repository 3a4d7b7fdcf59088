"""hydra.launcher.mps: the MPS daemon furcate starts, uses, refuses and stops, with a fake
``nvidia-cuda-mps-control`` (tests/fakes) run as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.execution.gpu import mps, mps_watch
from furcate_hydra.execution.gpu.mps import (
    BINARY,
    KEY,
    MPS_FAULT_BEHAVIOUR,
    START_TIMEOUT_S,
    MpsDaemon,
    MpsFaultScan,
    check_mps_mode,
    start_mps,
)
from furcate_hydra.execution.gpu.mps_watch import WATCH_LOG, control_answers
from furcate_hydra.layout import SweepPaths
from tests.process_helpers import alive, still_alive

FAKE = Path(__file__).parent / "fakes" / BINARY
TIME_SLICE = "jobs sharing a GPU time-slice it"


def modes(**by_device: str | None) -> Callable[[Sequence[str]], dict[str, str | None]]:
    """A compute-mode probe answering DEFAULT for every GPU but those named."""
    return lambda devices: {d: by_device.get(f"gpu{d}", "DEFAULT") for d in devices}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A dir whose path leaves room for MPS's sockets (pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def nothing_left_running(short_dir: Path, tmp_path: Path) -> Iterator[None]:
    """After each test, no fake daemon nor watchdog of this test still runs (any found is
    killed, and the test fails). One still ending gets 5 s: a watchdog that stopped its
    daemon exits a moment later (its interpreter's shutdown, slow on a busy machine)."""
    yield
    found: dict[psutil.Process, str] = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if BINARY not in command and mps_watch.__name__ not in command:
            continue
        try:
            environ = process.environ()
        except psutil.Error:
            continue
        dirs = (environ.get(f"CUDA_MPS_{kind}_DIRECTORY", "") for kind in ("PIPE", "LOG"))
        if any(d.startswith((str(short_dir), str(tmp_path))) for d in dirs):
            found[process] = command
    _, alive = psutil.wait_procs(list(found), timeout=5)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert [found[process] for process in alive] == []


@pytest.fixture(autouse=True)
def no_default_daemon(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """MPS's default pipe dir, moved where no daemon of this machine answers."""
    default = short_dir / "default"
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", default)
    return default


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The launcher's environment: the fake binary first on PATH, no CUDA_MPS_* variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / BINARY).symlink_to(FAKE)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    return {**clean, "PATH": f"{bin_dir}{os.pathsep}{clean.get('PATH', '')}"}


@pytest.fixture
def no_binary(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "empty"
    empty.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    return {**clean, "PATH": str(empty)}


def start(
    sweep: Path,
    environ: dict[str, str],
    said: list[str],
    *,
    mode: str = "auto",
    devices: Sequence[str] = ("0",),
    compute_modes: Callable[[Sequence[str]], dict[str, str | None]] | None = None,
    grace_s: float = 2.0,
) -> MpsDaemon:
    """``start_mps`` on shared GPUs, which must give a daemon."""
    daemon = start_mps(mode, devices, True, sweep, environ=environ,
                       compute_modes=compute_modes or modes(), grace_s=grace_s,
                       say=said.append)  # fmt: skip
    assert daemon is not None, said
    return daemon


def control_log(daemon: MpsDaemon) -> str:
    return (daemon.log_dir / "control.log").read_text()


def test_auto_on_shared_gpus_starts_a_daemon_that_stop_ends(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    sweep = short_dir / "sweep"
    daemon = start(
        sweep, env, said, devices=["2", "5"], compute_modes=modes(gpu5="EXCLUSIVE_PROCESS")
    )
    paths = SweepPaths.of(sweep)
    try:
        assert daemon.owned and alive(daemon.daemon_pid or 0)
        assert daemon.pipe_dir == paths.mps_pipe_dir and daemon.log_dir == paths.mps_log_dir
        assert control_answers(daemon.pipe_dir / "control")
        assert daemon.env() == {
            "CUDA_MPS_PIPE_DIRECTORY": str(paths.mps_pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(paths.mps_log_dir),
        }
        assert said == [daemon.line]
        assert daemon.line.startswith("furcate: MPS: started an MPS control daemon for GPUs 2,5")
        assert f"pipe dir {paths.mps_pipe_dir}" in daemon.line and "too long" not in daemon.line
        logged = control_log(daemon)
        assert "CUDA_VISIBLE_DEVICES=2,5" in logged and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in logged
        # MPS numbers the GPUs it was given from 0: a job on GPU 5 asks for device 1
        assert [daemon.visible_device(d) for d in ("2", "5", "GPU-1a2b")] == ["0", "1", "GPU-1a2b"]
    finally:
        daemon.stop()
    assert still_alive([daemon.daemon_pid or 0], timeout=5) == []
    assert not (daemon.pipe_dir / "control").exists()
    assert "Cmd:quit" in control_log(daemon)  # stopped by its own command, not killed
    assert daemon.pipe_dir.is_dir()  # the sweep's own: kept
    daemon.stop()  # again: nothing to do


def test_a_sweep_dir_too_long_for_a_socket_gets_a_short_temporary_pipe_dir(
    tmp_path: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    sweep = tmp_path / ("s" * 90)
    daemon = start(sweep, env, said)
    try:
        assert daemon.pipe_dir.name.startswith("furcate-mps-")
        assert len(os.fsencode(daemon.pipe_dir / "control")) <= 107
        assert control_answers(daemon.pipe_dir / "control")
        assert daemon.log_dir == SweepPaths.of(sweep).mps_log_dir
        assert "too long a path for a unix socket" in daemon.line
        assert daemon.env()["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir)
    finally:
        daemon.stop()
    assert not daemon.pipe_dir.exists()


def test_auto_without_the_binary_says_why_and_runs_without(
    short_dir: Path, no_binary: dict[str, str]
) -> None:
    said: list[str] = []
    sweep = short_dir / "sweep"
    assert start_mps("auto", ["0"], True, sweep, environ=no_binary, say=said.append) is None
    assert said == [f"furcate: MPS off: {BINARY} is not on PATH; {TIME_SLICE}"]
    assert not sweep.exists()


def test_on_without_the_binary_is_an_error_naming_key_value_and_fix(
    short_dir: Path, no_binary: dict[str, str]
) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        start_mps("on", ["0"], True, short_dir, environ=no_binary)
    error = raised.value
    assert (error.key, error.value) == (KEY, "on")
    assert f"{BINARY} is not on PATH" in error.problem
    assert "install the CUDA MPS binary" in error.fix and f"set {KEY}=auto or off" in error.fix


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_gpu_whose_compute_mode_prohibits_mps(
    mode: str, short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    probe = modes(gpu1="PROHIBITED")
    why = "GPU 1 is in compute mode PROHIBITED, which allows no MPS daemon"
    if mode == "auto":
        assert start_mps(mode, ["0", "1"], True, short_dir, environ=env, compute_modes=probe,
                         say=said.append) is None  # fmt: skip
        assert said == [f"furcate: MPS off: {why}; {TIME_SLICE}"]
        return
    with pytest.raises(FurcateConfigError) as raised:
        start_mps(mode, ["0", "1"], True, short_dir, environ=env, compute_modes=probe)
    assert why in raised.value.problem
    assert "nvidia-smi -i 1 -c DEFAULT" in raised.value.fix


def test_where_nvml_cannot_tell_auto_runs_without_and_on_starts_it(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    silent = modes(gpu0=None)
    assert start_mps("auto", ["0"], True, short_dir, environ=env, compute_modes=silent,
                     say=said.append) is None  # fmt: skip
    assert said == [f"furcate: MPS off: NVML cannot tell the compute mode of GPU 0; {TIME_SLICE}"]
    daemon = start(short_dir / "sweep", env, said, mode="on", compute_modes=silent)
    daemon.stop()


@pytest.mark.parametrize(
    ("mode", "shared", "devices"),
    [("auto", False, ["0"]), ("off", True, ["0"]), ("auto", True, [])],
    ids=["one-job-per-gpu", "off", "no-gpu"],
)
def test_nothing_starts_and_nothing_is_said(
    mode: str, shared: bool, devices: list[str], short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    sweep = short_dir / "sweep"
    assert start_mps(mode, devices, shared, sweep, environ=env, compute_modes=modes(),
                     say=said.append) is None  # fmt: skip
    assert said == [] and not sweep.exists()


def user_daemon(pipe: Path, env: dict[str, str]) -> int:
    """``nvidia-cuda-mps-control -d`` (the fake) at ``pipe``, as a user starts one: its pid."""
    started = subprocess.run(
        [str(FAKE), "-d"], env={**env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text())


@pytest.mark.parametrize("client", ["client on PATH", "no client on PATH"])
@pytest.mark.parametrize("where", ["CUDA_MPS_PIPE_DIRECTORY", "default pipe dir"])
def test_a_daemon_the_user_started_is_used_and_left_running(
    where: str, client: str, short_dir: Path, no_default_daemon: Path, env: dict[str, str],
    no_binary: dict[str, str],
) -> None:  # fmt: skip
    pipe = short_dir / "user-pipe" if where == "CUDA_MPS_PIPE_DIRECTORY" else no_default_daemon
    pid = user_daemon(pipe, env)
    try:
        # without the client on PATH (furcate could not start one) it is found by its socket
        launcher_env = dict(env if client == "client on PATH" else no_binary)
        if where == "CUDA_MPS_PIPE_DIRECTORY":
            launcher_env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        said: list[str] = []
        daemon = start(short_dir / "sweep", launcher_env, said, mode="on")
        assert said == [
            f"furcate: MPS: using the daemon already running (pipe dir {pipe}); furcate "
            "leaves it as it is"
        ]
        assert not daemon.owned and not SweepPaths.of(short_dir / "sweep").mps_log_dir.exists()
        expected = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)} if pipe != no_default_daemon else {}
        assert daemon.env() == expected
        daemon.stop()
        assert alive(pid) and control_answers(pipe / "control")
        logged = (pipe / "control.log").read_text()
        assert "Cmd:quit" not in logged
        # where NVIDIA's client is on PATH, furcate asked the daemon through it
        assert ("Cmd:get_server_list" in logged) == (client == "client on PATH")
    finally:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("left", ["a socket nobody answers", "a SOCK_STREAM server"])
def test_a_socket_that_is_no_mps_daemon_is_no_daemon(
    left: str, short_dir: Path, no_default_daemon: Path, env: dict[str, str]
) -> None:
    no_default_daemon.mkdir()
    kind = socket.SOCK_STREAM
    with socket.socket(socket.AF_UNIX, kind) as other:  # left by a daemon that died, or not MPS
        other.bind(str(no_default_daemon / "control"))
        if left == "a SOCK_STREAM server":
            other.listen(1)
        said: list[str] = []
        daemon = start(short_dir / "sweep", env, said)
        daemon.stop()
    assert daemon.owned and daemon.pipe_dir != no_default_daemon


def test_a_client_that_hangs_is_killed_and_counts_as_no_answer(
    short_dir: Path, env: dict[str, str]
) -> None:
    """A SOCK_SEQPACKET listener that never accepts: the client's connect is queued and its
    command waits for an answer that never comes."""
    pipe = short_dir / "pipe"
    pipe.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as mute:
        mute.bind(str(pipe / "control"))
        mute.listen(8)
        assert control_answers(pipe / "control")
        began = time.monotonic()
        answered, why = mps_watch.client_answers(str(FAKE), pipe, env, timeout_s=1.0)
        took = time.monotonic() - began
        assert not mps_watch.daemon_answers(pipe, str(FAKE), env, timeout_s=1.0)
    assert not answered
    assert why == f"`echo get_server_list | {FAKE}` did not end within 1 s (killed)"
    assert 1.0 <= took < 3.0
    assert mps_watch.daemon_answers(pipe, None) is False  # its file is left: nothing listens


def test_the_watchdog_refuses_a_pipe_dir_where_a_daemon_answers_already(
    short_dir: Path, env: dict[str, str]
) -> None:
    pipe, logs = short_dir / "pipe", short_dir / "log"
    logs.mkdir()
    first = user_daemon(pipe, {**env, "CUDA_MPS_LOG_DIRECTORY": str(logs)})
    try:
        watchdog = subprocess.run(
            [sys.executable, "-m", mps_watch.__name__, "--binary", str(FAKE), "--pipe-dir",
             str(pipe), "--log-dir", str(logs), "--grace", "1"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert watchdog.returncode == 1, watchdog.stderr
        assert json.loads(watchdog.stdout) == {
            "failed": f"another MPS control daemon already answers at {pipe / 'control'}"
        }
        assert alive(first) and control_answers(pipe / "control")  # left alone
        logged = (logs / "control.log").read_text()
        assert "Cmd:get_server_list" in logged and "Cmd:quit" not in logged
    finally:
        os.kill(first, signal.SIGKILL)


LAUNCHER = """
import json, os, signal, sys, time
from pathlib import Path
from furcate_hydra.execution.gpu import mps
from furcate_hydra.execution.gpu import mps_watch
sweep, default_pipe, fork, end = sys.argv[1:]
mps.DEFAULT_PIPE_DIR = Path(default_pipe)
daemon = mps.start_mps("auto", ["0"], True, Path(sweep), grace_s=2.0,
                       compute_modes=lambda devices: dict.fromkeys(devices, "DEFAULT"))
holder = 0
if fork == "fork":  # a fork of the launcher (the fork server) keeps the watchdog's pipe open
    holder = os.fork()
    if holder == 0:
        os.close(1)
        os.close(2)
        time.sleep(30)
        os._exit(0)
print(json.dumps({"pid": daemon.daemon_pid, "pipe": str(daemon.pipe_dir), "holder": holder}))
sys.stdout.flush()
if end == "kill -9":
    os.kill(os.getpid(), signal.SIGKILL)
began = time.monotonic()
daemon.stop()
print(json.dumps({"stop_s": time.monotonic() - began}))
"""


@pytest.mark.parametrize(
    ("fork", "end"), [("alone", "kill -9"), ("fork", "kill -9"), ("fork", "stop")]
)
def test_the_daemon_ends_with_the_launcher_even_where_a_fork_holds_its_pipe(
    fork: str, end: str, short_dir: Path, no_default_daemon: Path, env: dict[str, str]
) -> None:
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(short_dir / "sweep"), str(no_default_daemon),
         fork, end],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = [json.loads(line) for line in launcher.stdout.splitlines()]
    started = lines[0]
    try:
        if end == "kill -9":
            assert launcher.returncode == -signal.SIGKILL, launcher.stderr
        else:  # the watchdog stopped when told, not when the pipe closed: the fork holds it
            assert launcher.returncode == 0, launcher.stderr
            assert lines[1]["stop_s"] < 2.0
        assert still_alive([started["pid"]], timeout=5) == []
        assert not (Path(started["pipe"]) / "control").exists()
        assert (
            "Cmd:quit"
            in (SweepPaths.of(short_dir / "sweep").mps_log_dir / "control.log").read_text()
        )
    finally:
        if started["holder"]:
            os.kill(started["holder"], signal.SIGKILL)


@pytest.mark.parametrize("end", ["end of stdin", "SIGTERM"])
def test_the_watchdog_stops_the_daemon_at_the_end_of_its_stdin_or_at_sigterm(
    end: str, short_dir: Path, env: dict[str, str]
) -> None:
    pipe, logs = short_dir / "pipe", short_dir / "log"
    logs.mkdir()
    watchdog = subprocess.Popen(
        [sys.executable, "-m", mps_watch.__name__, "--binary", str(FAKE), "--pipe-dir",
         str(pipe), "--log-dir", str(logs), "--grace", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert watchdog.stdin is not None and watchdog.stdout is not None
    try:
        pid = json.loads(watchdog.stdout.readline())["ready"]
        assert alive(pid)
        if end == "SIGTERM":
            watchdog.send_signal(signal.SIGTERM)
        else:
            watchdog.stdin.close()  # its parent, this test, lives on
        assert watchdog.wait(5) == 0
        assert still_alive([pid], timeout=1) == []
        assert "Cmd:quit" in (logs / "control.log").read_text()
    finally:
        watchdog.kill()
        watchdog.wait()
        watchdog.stdout.close()


def test_a_daemon_that_ignores_quit_is_killed_after_the_grace_period(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    daemon = start(short_dir / "sweep", {**env, "FAKE_MPS_IGNORE_QUIT": "1"}, said, grace_s=1.0)
    daemon.stop()
    assert still_alive([daemon.daemon_pid or 0], timeout=2) == []
    assert "did not quit in 1 s: SIGKILL" in (daemon.log_dir / WATCH_LOG).read_text()


def test_a_daemon_that_never_answers_is_reported_with_its_log_and_ended(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    sweep = short_dir / "sweep"
    hung = {**env, "FAKE_MPS_NEVER_READY": "1"}
    assert start_mps("auto", ["0"], True, sweep, environ=hung, compute_modes=modes(),
                     timeout_s=1.0, grace_s=1.0, say=said.append) is None  # fmt: skip
    [line] = said
    assert line.startswith(
        "furcate: MPS off: the MPS control daemon did not start: it did not answer within 1 s "
        f"(its socket {SweepPaths.of(sweep).mps_pipe_dir / 'control'} took no SOCK_SEQPACKET "
        "connection)"
    )
    assert "fake daemon: never opening the socket" in line
    logged = (SweepPaths.of(sweep).mps_log_dir / "control.log").read_text()
    pid = int(logged.split(" Control ")[1].split("]")[0])
    assert still_alive([pid], timeout=2) == []


def test_auto_gives_a_daemon_that_never_answers_a_few_seconds_and_goes_on(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    hung = {**env, "FAKE_MPS_NEVER_READY": "1"}
    wait = START_TIMEOUT_S["auto"]
    assert wait <= 5.0 < START_TIMEOUT_S["on"]
    began = time.monotonic()
    assert start_mps("auto", ["0"], True, short_dir / "sweep", environ=hung,
                     compute_modes=modes(), say=said.append) is None  # fmt: skip
    took = time.monotonic() - began
    # the daemon that never answered is killed at once, not given quit's grace period (10 s)
    assert wait <= took < wait + 3.0, took
    [line] = said
    assert f"it did not answer within {wait:g} s" in line and line.endswith(TIME_SLICE)


def test_on_where_the_daemon_never_answers_is_an_error_within_its_timeout(
    short_dir: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(mps.START_TIMEOUT_S, "on", 2.0)  # 30 s: too long for a test
    hung = {**env, "FAKE_MPS_NEVER_READY": "1"}
    began = time.monotonic()
    with pytest.raises(FurcateConfigError) as raised:
        start_mps("on", ["0"], True, short_dir / "sweep", environ=hung, compute_modes=modes())
    took = time.monotonic() - began
    assert 2.0 <= took < 5.0, took
    error = raised.value
    assert (error.key, error.value) == (KEY, "on")
    assert "the MPS control daemon did not start: it did not answer within 2 s" in error.problem
    assert "fake daemon: never opening the socket" in error.problem
    assert f"set {KEY}=auto or off" in error.fix


def test_on_where_the_daemon_exits_at_start_is_an_error_with_its_log(
    short_dir: Path, env: dict[str, str]
) -> None:
    failing = {**env, "FAKE_MPS_EXIT_AT_START": "3"}
    with pytest.raises(FurcateConfigError) as raised:
        start_mps("on", ["0"], True, short_dir, environ=failing, compute_modes=modes())
    assert "exited with status 3" in raised.value.problem
    assert "exiting at start as asked" in raised.value.problem
    assert str(SweepPaths.of(short_dir).mps_log_dir) in raised.value.fix


def test_a_daemon_that_dies_mid_sweep_is_reported_as_a_fault(
    short_dir: Path, env: dict[str, str]
) -> None:
    said: list[str] = []
    daemon = start(short_dir / "sweep", env, said)
    try:
        assert daemon.faults() == []
        os.kill(daemon.daemon_pid or 0, signal.SIGKILL)
        deadline = time.monotonic() + 5
        found = daemon.faults()
        while not found and time.monotonic() < deadline:
            time.sleep(0.05)
            found = daemon.faults()
        [fault] = found
        assert "furcate's MPS watchdog" in fault and "exited with status -9" in fault
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("value", "mode"),
    [("auto", "auto"), (" On ", "on"), ("off", "off"), (True, "on"), ("False", "off")],
)
def test_a_mode_is_read_as_yaml_writes_it(value: object, mode: str) -> None:
    assert check_mps_mode(value) == mode


@pytest.mark.parametrize("value", ["sometimes", 1, None, ""])
def test_a_bad_mode_names_the_key_the_value_and_the_three_modes(value: object) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        check_mps_mode(value)
    error = raised.value
    assert (error.key, error.value) == (KEY, value)
    assert str(error).startswith(f"Invalid {KEY}={value!r}: must be one of auto, on, off. Fix: ")
    # each mode as a value to set, with what it does ("daemon" alone would hold "on")
    assert error.fix.startswith(f"set {KEY}=auto (start an MPS daemon where GPUs run several")
    assert "), on (always; an error where it cannot) or off (never)" in error.fix


def test_the_fault_scan_reports_each_fault_once_naming_the_gpu(tmp_path: Path) -> None:
    control = tmp_path / "control.log"
    server = tmp_path / "server-1" / "server.log"
    server.parent.mkdir()
    control.write_text(
        "[2024-05-01 12:00:00.100 Control 10] Starting control daemon\n"
        "[2024-05-01 12:00:01.200 Control 10] Server 20 exited with status 0\n"
    )
    server.write_text("[2024-05-01 12:00:00.300 Server 20] New client 30 connected\n")
    scan = MpsFaultScan(tmp_path, devices=["2", "5"])
    assert scan.faults() == []
    fault = "[2024-05-01 12:00:02.000 Server 20] Fatal GPU exception on device 1: Xid 31\n"
    with server.open("a") as out:
        out.write(fault)
        out.write("[2024-05-01 12:00:03.000 Server 20] Client 30 hit a fault")  # mid-write
    [first] = scan.faults()
    assert first == (
        "furcate: MPS: the MPS server (pid 20) on GPU 5 reported a fault at 2024-05-01 "
        f"12:00:02: Fatal GPU exception on device 1: Xid 31 ({server}); jobs on that GPU may "
        "have failed with it"
    )
    with (tmp_path / "foreground.log").open("a") as out:
        out.write(fault)  # the same line in the daemon's foreground output: reported once
    with server.open("a") as out:
        out.write("\n")
    [second] = scan.faults()
    assert "Client 30 hit a fault" in second and "jobs on the GPUs it serves" in second
    assert scan.faults() == []
    control.write_text("[2024-05-01 13:00:00.000 Control 11] Server 21 exited with status 1\n")
    [third] = scan.faults()  # a new control.log, shorter than the one read: read from its start
    assert "the MPS control daemon (pid 11)" in third


def test_the_fault_scan_reads_pids_padded_as_nvidias_logs_pad_them(tmp_path: Path) -> None:
    (tmp_path / "control.log").write_text(
        "[2026-02-06 09:34:17.770 Control   261] Starting control daemon using socket x\n"
        "[2026-02-06 09:34:40.100 Control   261] Server 337 exited with status 1\n"
    )
    [fault] = MpsFaultScan(tmp_path).faults()
    assert fault.startswith("furcate: MPS: the MPS control daemon (pid 261) reported a fault")


def test_the_fault_note_says_what_mps_isolates_and_what_not() -> None:
    for words in ("Volta", "address space", "fatal GPU exception", "every job sharing a GPU"):
        assert words in MPS_FAULT_BEHAVIOUR
