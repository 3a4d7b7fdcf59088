"""A warm process that has imported the heavy modules once and forks a fresh process per job."""

from __future__ import annotations

from furcate_hydra.execution.forkserver.client import ForkServerClient
from furcate_hydra.execution.forkserver.protocol import ChildReport, WarmContext

__all__ = ["ChildReport", "ForkServerClient", "WarmContext"]
