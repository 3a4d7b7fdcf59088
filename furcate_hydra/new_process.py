"""What a process forked to become another one (the fork server, a job, a DDP rank) resets of
what it inherited: the name ps shows, the root logger."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

__all__ = ["fresh_root_logger", "name_process"]


def name_process(name: str) -> None:
    """Set this process's name as ps shows it (Linux's ``comm``, 15 bytes); best effort."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name[:15])


def fresh_root_logger() -> None:
    """The root logger as a new interpreter has it: no handler (removed, not closed: they
    write to the parent's streams and files), WARNING. What the process imports next then sets
    up its logging as it would in one (Lightning adds its own handler only where the root
    logger has none); a Hydra set-up configures it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
