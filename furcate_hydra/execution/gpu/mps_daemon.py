"""An MPS control daemon a sweep uses: the one furcate starts under its watchdog, or the user's.

``start_daemon`` starts ``python -m furcate_hydra.execution.gpu.mps_watch`` in its own session
with the daemon's environment and reads its one answer; ``MpsDaemon.stop`` lets go of it (a
``stop`` line, then the pipe's end) and waits, bounded. ``mps`` decides whether to start one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from furcate_hydra.execution.gpu import mps_watch
from furcate_hydra.execution.gpu.mps_log import MpsFaultScan
from furcate_hydra.layout import SweepPaths

__all__ = ["LOG_ENV", "PIPE_ENV", "MpsDaemon", "start_daemon"]

log = logging.getLogger(__name__)

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
_SOCKET_PATH_MAX = 107  # bytes of a unix socket's path: sun_path is 108 with its NUL
_SOCKET_NAME_ROOM = 40  # the longest socket name MPS puts in its pipe dir, with a margin
_WATCHDOG_MARGIN_S = 5.0  # past the daemon's own timeouts, for the watchdog's interpreter


class MpsDaemon:
    """An MPS control daemon a sweep's GPU jobs connect to: one furcate started (``owned``) or
    the user's. The launcher owns this object: it adds ``env()`` to every GPU job's
    environment, names each job's GPU with ``visible_device``, reports ``faults()`` after a
    job ends, and calls ``stop()`` once at the sweep's end (again is harmless).

    Attributes:
        line: The one line saying what was done, as ``start_mps`` said it.
        pipe_dir: The daemon's ``CUDA_MPS_PIPE_DIRECTORY``.
        log_dir: Its ``CUDA_MPS_LOG_DIRECTORY``.
        devices: The GPU ids it was given (empty for the user's: not known).
        owned: Whether furcate started it (and so stops it).
        daemon_pid: The pid of the daemon furcate started.
    """

    def __init__(
        self,
        line: str,
        pipe_dir: Path,
        log_dir: Path,
        *,
        devices: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        watchdog: subprocess.Popen[bytes] | None = None,
        daemon_pid: int | None = None,
        temporary_pipe_dir: bool = False,
        grace_s: float = 10.0,
    ) -> None:
        self.line = line
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.devices = tuple(devices)
        self.owned = watchdog is not None
        self.daemon_pid = daemon_pid
        self._env = dict(env or {})
        self._watchdog = watchdog
        self._temporary_pipe_dir = temporary_pipe_dir
        self._grace_s = grace_s
        self._scan = MpsFaultScan(log_dir, self.devices)

    def env(self) -> dict[str, str]:
        """What every GPU job's environment needs to reach this daemon (nothing for a user's
        daemon at the default pipe dir)."""
        return dict(self._env)

    def visible_device(self, device_id: str) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` of a job on ``device_id`` under this daemon: MPS
        renumbers the GPUs it was given 0, 1, ...; a UUID stays a UUID. A user's daemon is
        assumed to see every GPU (its own ``CUDA_VISIBLE_DEVICES`` is not known)."""
        if not self.owned or not device_id.isdigit():
            return device_id
        return str(self.devices.index(device_id))

    def faults(self) -> list[str]:
        """One line per fault the daemon's logs reported since the last call."""
        return self._scan.faults()

    def stop(self) -> None:
        """Stop the daemon furcate started and wait (bounded) for it; never raises."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        try:
            _release(watchdog, self._grace_s + _WATCHDOG_MARGIN_S, self.daemon_pid)
        except Exception as exc:  # stopping runs in the launcher's cleanup: report, go on
            log.warning("furcate: MPS: stopping the daemon in %s: %s", self.pipe_dir, exc)
        finally:
            if self._temporary_pipe_dir:
                shutil.rmtree(self.pipe_dir, ignore_errors=True)


def _pipe_dir(wanted: Path) -> tuple[Path, bool]:
    """``wanted``, or a new short temporary dir (True) where ``wanted``'s sockets would have
    too long a path."""
    if _fits(wanted):
        return wanted, False
    base = tempfile.gettempdir()
    return Path(
        tempfile.mkdtemp(prefix="furcate-mps-", dir=base if _fits(Path(base)) else "/tmp")
    ), True


def _fits(pipe_dir: Path) -> bool:
    return len(os.fsencode(pipe_dir)) + 1 + _SOCKET_NAME_ROOM <= _SOCKET_PATH_MAX


def start_daemon(
    binary: str,
    devices: Sequence[str],
    sweep_dir: Path,
    env: Mapping[str, str],
    timeout_s: float,
    grace_s: float,
) -> tuple[MpsDaemon | None, str]:
    """The daemon furcate starts under its watchdog, or None and why it did not start."""
    paths = SweepPaths.of(sweep_dir)
    paths.mps_log_dir.mkdir(parents=True, exist_ok=True)
    pipe_dir, temporary = _pipe_dir(paths.mps_pipe_dir)
    daemon_env = {
        **env,
        PIPE_ENV: str(pipe_dir),
        LOG_ENV: str(paths.mps_log_dir),
        "CUDA_VISIBLE_DEVICES": ",".join(devices),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    command = [sys.executable, "-m", mps_watch.__name__, "--binary", binary]
    command += ["--pipe-dir", str(pipe_dir), "--log-dir", str(paths.mps_log_dir)]
    command += ["--timeout", str(timeout_s), "--grace", str(grace_s)]
    command += ["--remove-pipe-dir"] if temporary else []
    with open(paths.mps_log_dir / mps_watch.WATCH_LOG, "ab") as watch_log:
        watchdog = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=watch_log,
            env=daemon_env,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the launcher only
        )
    daemon_pid, why = _read_answer(watchdog, timeout_s + _WATCHDOG_MARGIN_S, paths.mps_log_dir)
    if daemon_pid is None:
        _release(watchdog, grace_s + _WATCHDOG_MARGIN_S, None)
        if temporary:
            shutil.rmtree(pipe_dir, ignore_errors=True)
        return None, f"the MPS control daemon did not start: {why}"
    where = f"pipe dir {pipe_dir}"
    if temporary:
        where += f", not {paths.mps_pipe_dir}: too long a path for a unix socket"
    line = (
        f"furcate: MPS: started an MPS control daemon for GPUs {','.join(devices)} ({where}; "
        f"logs in {paths.mps_log_dir}); it stops with the sweep"
    )
    daemon = MpsDaemon(
        line,
        pipe_dir,
        paths.mps_log_dir,
        devices=devices,
        env={PIPE_ENV: str(pipe_dir), LOG_ENV: str(paths.mps_log_dir)},
        watchdog=watchdog,
        daemon_pid=daemon_pid,
        temporary_pipe_dir=temporary,
        grace_s=grace_s,
    )
    return daemon, ""


def _read_answer(
    watchdog: subprocess.Popen[bytes], timeout_s: float, log_dir: Path
) -> tuple[int | None, str]:
    """The watchdog's one line: the daemon's pid, or None and why it did not start."""
    assert watchdog.stdout is not None
    readable, _, _ = select.select([watchdog.stdout], [], [], timeout_s)
    line = watchdog.stdout.readline() if readable else b""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("ready"), int):
        return answer["ready"], ""
    if isinstance(answer, dict) and "failed" in answer:
        return None, str(answer["failed"])
    watch_log = log_dir / mps_watch.WATCH_LOG
    if not readable:
        return None, f"its watchdog said nothing in {timeout_s:g} s (see {watch_log})"
    status = watchdog.poll()
    return None, f"its watchdog ended (status {status}) without answering (see {watch_log})"


def _release(watchdog: subprocess.Popen[bytes], timeout_s: float, daemon_pid: int | None) -> None:
    """Let go of the watchdog (it stops the daemon) and wait for it; past ``timeout_s``, kill
    the watchdog and the daemon's process group."""
    if watchdog.stdin is not None:
        try:
            # "stop" first: a fork of the launcher (the fork server) holds the pipe open too
            watchdog.stdin.write(b"stop\n")
            watchdog.stdin.flush()
        except OSError:
            pass  # the watchdog is gone already
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
    try:
        watchdog.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("furcate: MPS: the watchdog did not stop in %.0f s: killed", timeout_s)
        for group in (watchdog.pid, daemon_pid):
            if group is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        watchdog.wait()
    finally:
        if watchdog.stdout is not None:
            watchdog.stdout.close()
