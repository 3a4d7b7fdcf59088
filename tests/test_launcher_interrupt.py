"""Ctrl-C, SIGTERM or SIGUSR1 to a running sweep stops every job's whole process group."""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from furcate_hydra.execution import interrupts
from tests.process_helpers import (
    killed_if_left,
    start_probe_sweep,
    still_alive,
    wait_for_descendants,
)
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
        # SLURM's --signal=USR1 reaches every process of the step: the launcher stops as above
        pytest.param("sigusr1", "furcate", marks=pytest.mark.slow),  # CI runs it
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
    with killed_if_left(process):
        # fork server + 2 jobs + 2 children per job
        descendants = wait_for_descendants(psutil.Process(process.pid), 7, timeout=60)
        time.sleep(0.5)
        began = time.monotonic()
        if how == "ctrl_c":
            os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        elif how == "sigterm":
            os.kill(process.pid, signal.SIGTERM)
        elif how == "sigusr1":
            (server,) = psutil.Process(process.pid).children()  # the fork server
            for pid in (process.pid, server.pid):
                os.kill(pid, signal.SIGUSR1)
        else:
            # The launcher cannot clean up; its fork server sees the socket close and does.
            os.kill(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=30)
        took = time.monotonic() - began
    assert still_alive(descendants) == []
    assert process.returncode != 0
    assert took < 15, f"stopping took {took:.1f} s; stderr:\n{stderr.decode()}"
    if how != "sigkill":  # a launcher that could clean up recorded what it stopped
        assert sorted(r.info.status for r in job_runs(mlflow_store)) == ["KILLED", "KILLED"]
        # one line that says what happened and what to do, the shell's exit status, no trace
        signum = {"ctrl_c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}[
            how
        ]
        assert process.returncode == 128 + signum
        output = (stdout + stderr).decode()
        line = f"interrupted ({signum.name}): 2 jobs stopped and recorded as KILLED"
        assert line in output and "run the same command to resume" in output
        assert "Traceback" not in output
        rows = list(csv.DictReader((tmp_path / "sweep" / "run_data.csv").open()))
        assert sorted(row["status"] for row in rows) == ["KILLED", "KILLED"]
        # the summary counts them too, on the console and in summary.md
        assert "sweep of 2 jobs: 2 killed" in output
        assert "| killed | 2 |" in (tmp_path / "sweep" / "summary.md").read_text()


def test_ctrl_c_during_the_fork_servers_warm_up_stops_the_sweep(
    tmp_path: Path, mlflow_store: str
) -> None:
    # torch and Lightning make the warm-up last seconds: the Ctrl-C lands in it
    process = start_probe_sweep(
        tmp_path, "+i=0,1", "hydra.launcher.preload=[torch,pytorch_lightning]"
    )
    with killed_if_left(process):
        launcher = psutil.Process(process.pid)
        server = wait_for_descendants(launcher, 1, timeout=60)
        time.sleep(0.5)
        began = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
        took = time.monotonic() - began
    output = (stdout + stderr).decode()
    assert process.returncode == 128 + signal.SIGINT, output
    assert took < 10, f"stopping took {took:.1f} s:\n{output}"
    assert "interrupted while starting; no job ran" in output and "Traceback" not in output
    assert still_alive(server) == []
    assert not (tmp_path / "sweep" / "0" / "probe.json").exists()  # no job ran
    assert job_runs(mlflow_store) == []


def test_a_ctrl_c_python_lost_is_raised_at_the_next_check() -> None:
    before = signal.getsignal(signal.SIGINT)
    interrupts.install()
    try:
        try:  # as a weakref callback or __del__ swallows it
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs at the next bytecode; the sleep is cut short
        except KeyboardInterrupt:
            pass
        assert interrupts.received() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt, match="received SIGINT"):
            interrupts.check()
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGINT) is before
    # the session's signal stays its own: its exit status names it, and code that checks
    # after it (a scheduler outside any session, in the same process) is not interrupted
    assert interrupts.received() == signal.SIGINT
    interrupts.check()
