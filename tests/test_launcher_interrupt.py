"""Ctrl-C or SIGTERM to a running sweep stops every job's whole process group."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.process_helpers import start_probe_sweep, still_alive, wait_for_descendants
from tests.store_helpers import job_runs


@pytest.mark.parametrize(
    "how, sweeper",
    [
        ("ctrl_c", "basic"),
        ("sigterm", "basic"),
        ("sigkill", "basic"),
        # the grid sweeper streams through submit/wait_any rather than launch()
        ("ctrl_c", "furcate"),
        ("sigterm", "furcate"),
    ],
)
def test_interrupt_leaves_no_process_behind(
    tmp_path: Path, mlflow_store: str, how: str, sweeper: str
) -> None:
    process = start_probe_sweep(
        tmp_path,
        f"hydra/sweeper={sweeper}",
        "mode=spawn_and_hang",
        "+i=0,1",
        "hydra.launcher.gpus=[0,1]",
    )
    try:
        # fork server + 2 jobs + 2 children per job
        descendants = wait_for_descendants(psutil.Process(process.pid), 7, timeout=60)
        time.sleep(0.5)
        began = time.monotonic()
        if how == "ctrl_c":
            os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        elif how == "sigterm":
            os.kill(process.pid, signal.SIGTERM)
        else:
            # The launcher cannot clean up; its fork server sees the socket close and does.
            os.kill(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert still_alive(descendants) == []
    assert process.returncode != 0
    assert took < 15, f"stopping took {took:.1f} s; stderr:\n{stderr.decode()}"
    if how != "sigkill":  # a launcher that could clean up recorded what it stopped
        assert sorted(r.info.status for r in job_runs(mlflow_store)) == ["KILLED", "KILLED"]
