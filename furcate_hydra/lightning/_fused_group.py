"""The fused group the launcher started a job in (``hydra.launcher.fuse=auto``), as the job
reads it: its directory, its size, the job's key there, its width, and the group's secret
(handed down in memory by the fork server: ``furcate_hydra.job_secrets``); and the slot's
turn, one training at a time on the group's slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from furcate_hydra import env_vars, job_secrets
from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.fusion.group_width import Width

__all__ = ["GroupEnv", "slot_turn"]

log = logging.getLogger("furcate_hydra.lightning")


@dataclass(frozen=True)
class GroupEnv:
    """The fused group the launcher started this job in (``hydra.launcher.fuse=auto``)."""

    directory: Path
    size: int
    key: str
    fuse_max: int
    gather_s: float
    min_gain: float | None = None  # set: the group's width is learned (fuse_max unset)
    # what its members prove they hold; None: none was handed down (it cannot join)
    secret: bytes | None = None

    @classmethod
    def from_environ(cls) -> GroupEnv | None:
        """None: the job is in no group (fusion off, or it started alone)."""
        directory = os.environ.get(env_vars.FUSE_DIR)
        if not directory:
            return None
        return cls(
            Path(directory),
            int(os.environ[env_vars.FUSE_SIZE]),
            os.environ[env_vars.FUSE_KEY],
            int(os.environ[env_vars.FUSE_MAX]),
            float(os.environ[env_vars.FUSE_TIMEOUT_S]),
            float(gain) if (gain := os.environ.get(env_vars.FUSE_MIN_GAIN)) else None,
            job_secrets.secret(job_secrets.FUSED_GROUP),
        )

    def widths_learned(self) -> Callable[[list[str], Width], None]:
        """What the leader does with each group's learned width: says it in its log, and
        leaves it for the launcher (``FUSE_WIDTH_REPORT``) to size the groups it starts next."""
        reports: list[dict[str, Any]] = []

        def learned(members: list[str], width: Width) -> None:
            log.info("furcate: fused: %s", width.describe(len(members)))
            reports.append({"members": len(members), "width": width.width, "rising": width.rising})
            report = json.dumps(reports).encode()
            atomic_write_bytes(self.directory / env_vars.FUSE_WIDTH_REPORT, report, durable=False)

        return learned


@contextlib.contextmanager
def slot_turn(group: GroupEnv) -> Iterator[None]:
    """One training at a time on the group's slot: its leader's groups, then each member
    that runs alone, in turn (the slot's cores are the group's, as a job's are its own)."""
    with (group.directory / "slot.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
