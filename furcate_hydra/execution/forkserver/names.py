"""What ps and top call the fork server and its jobs (a fork keeps the launcher's command line)."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["JOB_NAME", "SERVER_NAME", "name_process"]

SERVER_NAME = "furcate-server"
JOB_NAME = "furcate-job"


def name_process(name: str) -> None:
    """Set this process's name as ps shows it (Linux's ``comm``, 15 bytes); best effort."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name[:15])
