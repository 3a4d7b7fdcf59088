"""A SIGKILL in the middle of a checkpoint write never leaves last.json naming a bad file.

A real training process saves a ~12 MB checkpoint after every step; the test kills it with
SIGKILL the moment a temporary checkpoint file appears (a write in progress), then checks
what a relaunch would find, and relaunches it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.conftest import APPS, REPO

# two training processes that save ~12 MB after every step (~30 s here)
pytestmark = pytest.mark.slow


def start_writer(root: Path, epochs: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(APPS / "checkpoint_writer.py"), str(root), str(epochs)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def kill_mid_write(process: subprocess.Popen[bytes], checkpoints: Path) -> str:
    """SIGKILL the process while a checkpoint is being written; the temporary file's name."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        writing = [p.name for p in checkpoints.glob(".*.ckpt.tmp")] if checkpoints.is_dir() else []
        # a pointer first: the write being killed is not the first, so last.json must survive it
        if writing and (checkpoints / "last.json").exists():
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            return writing[0]
        time.sleep(0.001)
    process.kill()
    stderr = process.stderr.read().decode() if process.stderr else ""
    pytest.fail(f"no checkpoint write caught in progress:\n{stderr}")


def test_sigkill_during_a_checkpoint_write_leaves_a_verified_pointer(tmp_path: Path) -> None:
    from furcate_hydra.lightning._checkpoint import find_resume_checkpoint, read_pointer
    from furcate_hydra.lightning._pointer import sha256_of

    checkpoints = tmp_path / "checkpoints"
    process = start_writer(tmp_path, epochs=50)
    in_progress = kill_mid_write(process, checkpoints)
    assert process.returncode == -signal.SIGKILL

    pointer = read_pointer(checkpoints)
    assert pointer is not None
    for entry in pointer.entries:  # every file it names is whole: its recorded hash matches
        assert sha256_of(checkpoints / entry.file) == entry.sha256
    assert in_progress.removeprefix(".").removesuffix(".tmp") not in {
        e.file for e in pointer.entries
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the pointer is sound
        assert find_resume_checkpoint(checkpoints) == checkpoints / pointer.file

    # a relaunch resumes from it and, at its first save, clears the half-written file away
    relaunch = start_writer(tmp_path, epochs=pointer.epoch + 1)
    assert relaunch.wait(timeout=300) == 0, (
        relaunch.stderr.read().decode() if relaunch.stderr else ""
    )
    assert not list(checkpoints.glob(".*.tmp"))
    assert read_pointer(checkpoints).epoch == pointer.epoch  # type: ignore[union-attr]
