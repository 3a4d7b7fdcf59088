"""Start a probe-app sweep as a user's terminal would, and watch its processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import APPS


def start_sweep(
    app: str,
    tmp_path: Path,
    *overrides: str,
    stderr: int = subprocess.PIPE,
    stdout: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """``python <app> -m <overrides>`` in the background, in tmp_path, its sweep dir at
    tmp_path/sweep, in its own process group (a terminal's foreground job), so that a test can
    Ctrl-C or kill it. Read what is piped with ``communicate``."""
    return subprocess.Popen(
        [
            sys.executable,
            str(APPS / app),
            "-m",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *overrides,
        ],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def start_probe_sweep(tmp_path: Path, *overrides: str) -> subprocess.Popen[bytes]:
    """The probe app's sweep; stdout and stderr piped (Hydra logs to stdout)."""
    return start_sweep("probe_app.py", tmp_path, *overrides, stdout=subprocess.PIPE)


@contextmanager
def killed_if_left(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """The sweep's process group is SIGKILLed if the test leaves it running (a failed wait)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: list[int], timeout: float = 10) -> list[int]:
    """The pids still running once they all ended or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def wait_for_descendants(launcher: psutil.Process, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [child.pid for child in launcher.children(recursive=True)]
        if len(pids) >= count:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"only {len(launcher.children(recursive=True))} descendants appeared")


def wait_for(
    condition: Callable[[], bool],
    process: subprocess.Popen[Any],
    what: str,
    timeout: float = 120,
) -> None:
    """Poll ``condition`` until it holds; fail with what ``process`` printed if it ends first,
    and kill it if ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            printed = "".join(_text(part) for part in process.communicate())
            pytest.fail(f"the sweep ended before {what}:\n{printed}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""
