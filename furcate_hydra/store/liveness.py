"""Is the launcher that left a run RUNNING still alive? Decides whether a run was interrupted.

On the same machine (same boot) a process is identified by its pid plus its start time, so
a recycled pid is not mistaken for the old launcher. Elsewhere, the sweep's heartbeat tells:
a launcher refreshes it every few seconds, so an old heartbeat means the launcher is gone.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags

__all__ = ["Gone", "LauncherIdentity", "launcher_gone", "liveness", "process_start_ticks"]

# Why a RUNNING run's launcher is gone, or None while it may be alive.
Gone = Callable[[RunRecord], "str | None"]


@dataclass(frozen=True)
class LauncherIdentity:
    """Where and which process a launcher is; written as tags on every run it starts."""

    host: str
    boot_id: str
    pid: int
    started: str

    @classmethod
    def current(cls) -> LauncherIdentity:
        pid = os.getpid()
        return cls(socket.gethostname(), _boot_id(), pid, process_start_ticks(pid) or "")

    def tags(self) -> dict[str, str]:
        return {
            Tags.HOST: self.host,
            Tags.BOOT_ID: self.boot_id,
            Tags.LAUNCHER_PID: str(self.pid),
            Tags.LAUNCHER_STARTED: self.started,
        }


def launcher_gone(
    record: RunRecord,
    here: LauncherIdentity,
    heartbeat: float | None,
    now: float,
    stale_after_s: float,
) -> str | None:
    """Why the launcher of a RUNNING run is gone, or None while it may still be running it."""
    tags = record.tags
    if tags.get(Tags.HOST) == here.host and here.boot_id:
        if tags.get(Tags.BOOT_ID) != here.boot_id:
            return "its machine has restarted since"
        pid = int(tags.get(Tags.LAUNCHER_PID, "0") or 0)
        started = process_start_ticks(pid) if pid > 0 else None
        if started is None or started != tags.get(Tags.LAUNCHER_STARTED):
            return f"its launcher (pid {pid} on this machine) has exited"
        return None
    if heartbeat is None:
        return "its launcher never sent a heartbeat"
    age = now - heartbeat
    if age > stale_after_s:
        return f"its launcher on {tags.get(Tags.HOST, '?')} last sent a heartbeat {age:.0f} s ago"
    return None


def liveness(
    records: Iterable[RunRecord],
    here: LauncherIdentity,
    heartbeats: Callable[[set[str]], dict[str, float]],
    stale_after_s: float,
) -> Gone:
    """``launcher_gone`` for these records' RUNNING runs, with the heartbeats it needs (those
    of sweeps on other machines, read once by ``heartbeats(parent run ids)``: here a pid
    tells)."""
    remote = {
        r.parent_run_id
        for r in records
        if r.status is RunStatus.RUNNING
        and r.parent_run_id
        and not (here.boot_id and r.tags.get(Tags.HOST) == here.host)
    }
    beats = heartbeats(remote) if remote else {}
    now = time.time()

    def gone(record: RunRecord) -> str | None:
        beat = beats.get(record.parent_run_id or "")
        return launcher_gone(record, here, beat, now, stale_after_s)

    return gone


def process_start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after it do not.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
