"""The watchdog that owns the MPS control daemon furcate starts: it outlives nothing it watches.

    launcher ──stdin pipe──▶ python -m furcate_hydra.execution.gpu.mps_watch   (its own session)
                                └─ nvidia-cuda-mps-control -f              (its own session)

The watchdog starts the daemon in the foreground, waits until it answers (``daemon_answers``)
and prints one line, ``{"ready": <daemon pid>}`` (or ``{"failed": "<why>"}``), on stdout. It
then waits for the launcher to let go: a ``stop`` line on stdin, stdin's end (the launcher
closed it, or died: a ``kill -9`` closes it too), a change of its parent (a fork of the launcher
holds the pipe open after the launcher died), or SIGTERM/SIGHUP. Then it writes ``quit`` to the
daemon's own control command, as NVIDIA's docs stop it, waits ``--grace`` seconds, SIGKILLs the
daemon's process group if it is still there, removes a temporary pipe dir and exits. A daemon
that never answered is SIGKILLed at once: no CUDA client reached it, so it has no server to
wind down, and a ``quit`` could not reach it anyway.

How a daemon is asked whether it answers:

- NVIDIA documents the pipe dir's ``control`` socket (``/tmp/nvidia-mps/control`` by default)
  but not its type. On an H200 (driver 580) it was a SOCK_SEQPACKET unix socket: a SOCK_STREAM
  connect to it failed with EPROTOTYPE. ``control_answers`` connects as SOCK_SEQPACKET and
  sends nothing, cheap enough for the start's 50 ms polling.
- NVIDIA's own client is the documented way to talk to the daemon: commands on the stdin of
  ``nvidia-cuda-mps-control`` with the daemon's ``CUDA_MPS_PIPE_DIRECTORY``. NVIDIA's device
  plugin for Kubernetes checks its daemon's health that way, by the client's exit status.
  ``client_answers`` pipes ``get_server_list`` (a query: it changes nothing) and takes exit
  status 0 as an answer; a client still running after its timeout is killed and counts as none.

What it reports goes to its stderr, which the launcher points at ``<log dir>/watchdog.log``, in
the MPS logs' line format, so the launcher's scan of the log dir finds a daemon that died.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from types import FrameType

__all__ = [
    "CLIENT_TIMEOUT_S",
    "CONTROL_SOCKET",
    "FOREGROUND_LOG",
    "PROBE_COMMAND",
    "WATCH_LOG",
    "client_answers",
    "control_answers",
    "daemon_answers",
    "log_tail",
    "main",
]

CONTROL_SOCKET = "control"  # the daemon's socket in its pipe dir, as in /tmp/nvidia-mps/control
FOREGROUND_LOG = "foreground.log"  # what the daemon prints in the foreground (-f)
WATCH_LOG = "watchdog.log"
PROBE_COMMAND = "get_server_list"
# NVIDIA's client answered at once on the H200; this bounds one that hangs, not a slow one
CLIENT_TIMEOUT_S = 5.0
_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
_POLL_S = 0.05
_CLIENT_RETRY_S = 0.25  # after a client that got no answer: not a process every 50 ms
_PARENT_POLL_S = 0.2


def control_answers(path: Path) -> bool:
    """Whether something listens on ``path`` as MPS's control socket does: a SOCK_SEQPACKET
    connect succeeds. A socket file left by a daemon that died refuses it (ECONNREFUSED), and
    so does a SOCK_STREAM server (EPROTOTYPE): neither is a daemon."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
    return True


def client_answers(
    binary: str,
    pipe_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> tuple[bool, str]:
    """Whether NVIDIA's client gets an answer from the daemon at ``pipe_dir``: ``echo
    get_server_list | <binary>`` with ``CUDA_MPS_PIPE_DIRECTORY=<pipe_dir>`` (over ``env``,
    ``os.environ`` if None) exits 0 within ``timeout_s``. Also what it printed, or why not."""
    command = f"echo {PROBE_COMMAND} | {binary}"
    try:
        done = subprocess.run(
            [binary],
            input=f"{PROBE_COMMAND}\n".encode(),
            capture_output=True,
            env={**(os.environ if env is None else env), _PIPE_ENV: os.fspath(pipe_dir)},
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"`{command}` did not end within {timeout_s:g} s (killed)"
    except OSError as exc:
        return False, f"`{command}` could not run: {exc}"
    said = (done.stdout + done.stderr).decode(errors="replace").strip()
    if done.returncode != 0:
        return False, f"`{command}` exited with status {done.returncode}: {said or '(silent)'}"
    return True, said


def daemon_answers(
    pipe_dir: Path,
    binary: str | None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> bool:
    """Whether an MPS control daemon answers at ``pipe_dir``: its control socket takes a
    SOCK_SEQPACKET connect (cheap: where nothing listens no client is started) and, where
    ``binary`` (NVIDIA's client) is known, the client gets an answer from it."""
    if not control_answers(pipe_dir / CONTROL_SOCKET):
        return False
    return binary is None or client_answers(binary, pipe_dir, env, timeout_s)[0]


def log_tail(log_dir: Path, lines: int = 15) -> str:
    """The last lines of the daemon's logs, for a message saying why it did not start."""
    parts = []
    for name in (FOREGROUND_LOG, "control.log"):
        path = log_dir / name
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if text:
            parts.append(f"{path}:\n  " + "\n  ".join(text))
    return "\n".join(parts) or f"(nothing in {log_dir})"


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop the daemon as at the launcher's end."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _say(message: str) -> None:
    # the MPS logs' format, "[date time.ms Who pid] message", so one scan reads them all
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    print(f"[{now} Watch {os.getpid()}] {message}", file=sys.stderr, flush=True)


def _answer(**fields: object) -> None:
    try:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()
    except OSError:  # the launcher is gone: the wait that follows sees it too
        pass


def _start(binary: str, pipe_dir: Path, log_dir: Path) -> subprocess.Popen[bytes]:
    with open(log_dir / FOREGROUND_LOG, "ab") as out:
        # its own session: the watchdog's group is never the daemon's, so SIGKILL can take
        # the daemon and the MPS servers it started (its children) as one group
        return subprocess.Popen(
            [binary, "-f"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(
    binary: str, daemon: subprocess.Popen[bytes], pipe_dir: Path, timeout_s: float
) -> str | None:
    """None once the daemon answers (its socket, then NVIDIA's client), else why not."""
    control = pipe_dir / CONTROL_SOCKET
    deadline = time.monotonic() + timeout_s
    why = f"its socket {control} took no SOCK_SEQPACKET connection"
    while True:
        pause = _POLL_S
        if control_answers(control):
            left = max(deadline - time.monotonic(), _CLIENT_RETRY_S)
            answered, said = client_answers(binary, pipe_dir, timeout_s=min(CLIENT_TIMEOUT_S, left))
            if answered:
                return None
            why, pause = f"its socket {control} took a connection, but {said}", _CLIENT_RETRY_S
        if daemon.poll() is not None:
            return f"it exited with status {daemon.returncode} before it answered ({why})"
        if time.monotonic() > deadline:
            return f"it did not answer within {timeout_s:g} s ({why})"
        time.sleep(pause)


def _wait_for_release(daemon: subprocess.Popen[bytes], parent: int) -> None:
    """Until the launcher lets go of the daemon, or the daemon ends by itself."""
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], _PARENT_POLL_S)
        if readable:
            data = os.read(sys.stdin.fileno(), 4096)
            if not data or b"stop" in data:
                return
        if os.getppid() != parent:
            _say("the launcher is gone: stopping the MPS control daemon")
            return
        if daemon.poll() is not None:
            _say(f"the MPS control daemon exited with status {daemon.returncode} mid-sweep")
            return


def _stop(binary: str, daemon: subprocess.Popen[bytes], grace_s: float) -> None:
    """``echo quit | nvidia-cuda-mps-control`` (this process's CUDA_MPS_PIPE_DIRECTORY), then
    SIGKILL of the daemon's group where it has not ended within ``grace_s``."""
    deadline = time.monotonic() + grace_s
    if daemon.poll() is None:
        try:
            subprocess.run(
                [binary],
                input=b"quit\n",
                stdout=sys.stderr,
                stderr=sys.stderr,
                timeout=grace_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say(f"quit did not reach the MPS control daemon: {exc}")
    try:
        daemon.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(daemon, f"did not quit in {grace_s:g} s")


def _kill(daemon: subprocess.Popen[bytes], why: str) -> None:
    """SIGKILL of the daemon's process group, now."""
    _say(f"the MPS control daemon {daemon.pid} {why}: SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m furcate_hydra.execution.gpu.mps_watch")
    parser.add_argument("--binary", required=True)
    parser.add_argument("--pipe-dir", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--remove-pipe-dir", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until released (see the module's doc); 0, or 1 where it did not start."""
    args = _parse(argv)
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns the terminal's Ctrl-C
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = str(args.pipe_dir)
    os.environ["CUDA_MPS_LOG_DIRECTORY"] = str(args.log_dir)
    control = args.pipe_dir / CONTROL_SOCKET
    daemon, ready = None, False
    try:
        args.pipe_dir.mkdir(parents=True, exist_ok=True)
        if control_answers(control):  # never unlink a socket something listens on
            answered, said = client_answers(args.binary, args.pipe_dir)
            who = "another MPS control daemon" if answered else f"something ({said})"
            _answer(failed=f"{who} already answers at {control}")
            return 1
        control.unlink(missing_ok=True)  # left by a daemon that died
        daemon = _start(args.binary, args.pipe_dir, args.log_dir)
        why = _wait_ready(args.binary, daemon, args.pipe_dir, args.timeout)
        if why is not None:
            _answer(failed=f"{why}; {log_tail(args.log_dir)}")
            return 1
        ready = True
        _answer(ready=daemon.pid)
        _wait_for_release(daemon, parent)
    except _Stop as stop:
        _say(f"{stop}: stopping the MPS control daemon")
    except OSError as exc:
        _answer(failed=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop below runs to its end
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if daemon is not None and ready:
            _stop(args.binary, daemon, args.grace)
        elif daemon is not None and daemon.poll() is None:
            _kill(daemon, "never answered")
        if args.remove_pipe_dir:
            shutil.rmtree(args.pipe_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
