"""Is the launcher of a RUNNING run alive? Real processes on this machine, heartbeats elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from furcate_hydra.store import LauncherIdentity, RunRecord, RunStatus, Tags, launcher_gone
from furcate_hydra.store.liveness import process_start_ticks
from tests.store_helpers import exited_launcher

HERE = LauncherIdentity.current()
STALE_AFTER_S = 30.0


def running(tags: dict[str, str]) -> RunRecord:
    return RunRecord("run", "fp", RunStatus.RUNNING, 0, tags)


def gone(tags: dict[str, str], heartbeat: float | None = None, now: float = 1000.0) -> str | None:
    return launcher_gone(running(tags), HERE, heartbeat, now, STALE_AFTER_S)


@pytest.fixture
def exited() -> LauncherIdentity:
    """The identity of a launcher process that ran on this machine and has exited."""
    return exited_launcher()


def test_this_process_is_alive() -> None:
    assert HERE.boot_id and HERE.started
    assert gone(HERE.tags()) is None


def test_a_launcher_that_exited_is_gone(exited: LauncherIdentity) -> None:
    assert gone(exited.tags()) == f"its launcher (pid {exited.pid} on this machine) has exited"


def test_a_recycled_pid_is_not_the_old_launcher() -> None:
    # Our own pid, but recorded with a different start time: a previous process had the pid.
    recycled = replace(HERE, started=str(int(HERE.started) - 1))
    assert gone(recycled.tags()) == f"its launcher (pid {os.getpid()} on this machine) has exited"


@pytest.mark.parametrize("pid", ["", "0"])
def test_a_run_without_a_launcher_pid_is_gone(pid: str) -> None:
    assert gone({**HERE.tags(), Tags.LAUNCHER_PID: pid}) is not None


def test_a_restarted_machine_means_gone_even_for_a_live_pid() -> None:
    rebooted = replace(HERE, boot_id="another-boot")
    assert gone(rebooted.tags(), heartbeat=1000.0) == "its machine has restarted since"


def test_another_host_is_judged_by_its_heartbeat() -> None:
    # The same pid and boot id as ours, but on another host: the pid says nothing there.
    elsewhere = replace(HERE, host="other-host").tags()
    assert gone(elsewhere, heartbeat=995.0, now=1000.0) is None
    assert gone(elsewhere, heartbeat=1000.0 - STALE_AFTER_S, now=1000.0) is None
    stale = gone(elsewhere, heartbeat=900.0, now=1000.0)
    assert stale == "its launcher on other-host last sent a heartbeat 100 s ago"
    assert gone(elsewhere, heartbeat=None) == "its launcher never sent a heartbeat"


def test_without_a_boot_id_here_the_heartbeat_decides() -> None:
    # Where /proc has no boot id, pid and start time cannot be trusted across reboots.
    blind = replace(HERE, boot_id="")
    tags = replace(HERE, pid=0, started="").tags()  # a pid that would count as exited
    assert launcher_gone(running(tags), blind, 995.0, 1000.0, STALE_AFTER_S) is None
    assert launcher_gone(running(tags), blind, None, 1000.0, STALE_AFTER_S) is not None


def test_process_start_ticks_of_a_missing_pid_is_none(exited: LauncherIdentity) -> None:
    assert process_start_ticks(exited.pid) is None
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert process_start_ticks(pid_max + 1) is None


def test_process_start_ticks_of_this_process_is_stable() -> None:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None and ticks.isdigit()
    time.sleep(0.05)
    assert process_start_ticks(os.getpid()) == ticks == HERE.started
    # Our parent started no later than we did.
    later = process_start_ticks(os.getppid())
    assert later is not None and int(later) <= int(ticks)


@pytest.fixture
def oddly_named(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command name holds spaces and parentheses, as /proc/PID/stat shows it."""
    link = tmp_path / "a) b (c"
    link.symlink_to(sys.executable)
    child = subprocess.Popen([str(link), "-c", "import time; time.sleep(30)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_process_start_ticks_reads_past_an_odd_command_name(
    oddly_named: subprocess.Popen[bytes],
) -> None:
    assert "a) b (c" in Path(f"/proc/{oddly_named.pid}/stat").read_text()
    ticks = process_start_ticks(oddly_named.pid)
    assert ticks is not None
    # psutil derives the same start time independently: ticks / CLK_TCK after boot.
    started = psutil.boot_time() + int(ticks) / os.sysconf("SC_CLK_TCK")
    assert started == pytest.approx(psutil.Process(oddly_named.pid).create_time(), abs=1.0)
