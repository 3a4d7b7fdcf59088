"""What MPS isolates between the jobs sharing a GPU, and the scan of its logs for faults.

The MPS control daemon writes ``control.log`` in its log dir (``CUDA_MPS_LOG_DIRECTORY``); each
server it starts writes ``server.log`` there (``<log dir>/<server>/server.log`` in releases that
name their servers). A line reads ``[2024-05-01 12:00:00.123 Server  4567] message`` (the pid
right-aligned in 5 columns, as in the control daemon logs NVIDIA's users post). NVIDIA
documents which events these logs hold (server start and exit, clients connecting) but not the
wording of a fault, so the scan takes a line whose message speaks of a fatal error, an
exception, a fault, an Xid, or a process that exited with a non-zero status, and quotes it as
it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["MPS_FAULT_BEHAVIOUR", "MpsFaultScan"]

MPS_FAULT_BEHAVIOUR = (
    "Under MPS the jobs sharing a GPU are clients of one MPS server. On Volta and newer GPUs "
    "each job keeps its own GPU address space, so one job cannot read or overwrite another's "
    "memory, but a fatal GPU exception in one job (an illegal memory access, say) is raised in "
    "every job sharing a GPU with it: they fail with it, whichever caused it, and the server "
    "takes no new job on that GPU until all of them have exited. Jobs on the server's other "
    "GPUs keep running. A crash of the MPS server itself ends all its jobs. On GPUs older than "
    "Volta the jobs share one address space: an out-of-range write in one can corrupt "
    "another's memory, and a fault ends every job of the server. Memory and SM time are not "
    "partitioned unless the jobs ask for limits (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, "
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)."
)

_LINE = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? (?P<who>\w+) +(?P<pid>\d+)\]\s*"
    r"(?P<message>.*)$"
)
_FAULT = re.compile(
    r"fatal|exception|fault|\bxid\b|exit(?:ed)? with (?:status|code) -?[1-9]", re.IGNORECASE
)
_DEVICE = re.compile(r"\bdevice (\d+)", re.IGNORECASE)
_WHO = {
    "Server": "the MPS server",
    "Control": "the MPS control daemon",
    "Watch": "furcate's MPS watchdog",
}


class MpsFaultScan:
    """Reads a daemon's log dir from where its last call stopped; reports the faults it finds.

    Args:
        log_dir: The daemon's ``CUDA_MPS_LOG_DIRECTORY``.
        devices: The GPU ids the daemon was given, in its ``CUDA_VISIBLE_DEVICES`` order: MPS
            numbers them 0, 1, ... and a report names them as the sweep does. Empty where it
            is not known (a daemon the user started): the report gives MPS's number.
    """

    def __init__(self, log_dir: Path, devices: Sequence[str] = ()) -> None:
        self.log_dir = log_dir
        self.devices = tuple(devices)
        self._offsets: dict[Path, int] = {}
        self._seen: set[tuple[str, str]] = set()

    def faults(self) -> list[str]:
        """One line per fault logged since the last call, oldest first within each file.

        Never raises: an unreadable log is read again at the next call.
        """
        reports = []
        for path in self._logs():
            for line in self._new_lines(path):
                report = self._report(path, line)
                if report is not None:
                    reports.append(report)
        return reports

    def _logs(self) -> list[Path]:
        try:
            return sorted(self.log_dir.glob("*.log")) + sorted(self.log_dir.glob("*/server.log"))
        except OSError:
            return []

    def _new_lines(self, path: Path) -> Iterator[str]:
        offset = self._offsets.get(path, 0)
        try:
            with path.open("rb") as log:
                if log.seek(0, 2) < offset:
                    offset = 0  # a new file under the same name: read it from its start
                log.seek(offset)
                data = log.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written: next call
        self._offsets[path] = offset + len(complete)
        yield from complete.decode(errors="replace").splitlines()

    def _report(self, path: Path, line: str) -> str | None:
        parsed = _LINE.match(line)
        if parsed is None or not _FAULT.search(parsed["message"]):
            return None
        key = (parsed["time"], parsed["message"])
        if key in self._seen:  # the same line in the foreground output and control.log
            return None
        self._seen.add(key)
        who = f"{_WHO.get(parsed['who'], parsed['who'])} (pid {parsed['pid']})"
        device = _DEVICE.search(parsed["message"])
        if device is None:
            where, jobs = "", "jobs on the GPUs it serves"
        else:
            where, jobs = f" on GPU {self._gpu(int(device[1]))}", "jobs on that GPU"
        return (
            f"furcate: MPS: {who}{where} reported a fault at {parsed['time']}: "
            f"{parsed['message'].strip()} ({path}); {jobs} may have failed with it"
        )

    def _gpu(self, number: int) -> str:
        if number < len(self.devices):
            return self.devices[number]
        return f"{number} (as that MPS daemon numbers its GPUs)"
