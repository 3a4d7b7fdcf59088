"""Secrets a job's process holds in memory only, handed down by the fork server that forked it.

    launcher: job.secrets ──► Start (over the fork server's socketpair) ──► fork ──► hand_down
    job: secret(FUSED_GROUP) ──► its fused group's key

Never in the environment: a variable reaches every program the job starts, and shows in
``/proc/PID/environ`` of each one exec'd with it. A forked process's memory is its own.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["FUSED_GROUP", "KEY_BYTES", "hand_down", "secret"]

# the key the members of a fused group prove they hold (fusion/sealed_line.py)
FUSED_GROUP = "fused-group"
KEY_BYTES = 32  # as long as the HMAC-SHA256 it keys

_held: dict[str, bytes] = {}


def hand_down(secrets: Mapping[str, bytes]) -> None:
    """This process's secrets, from now on (in the job's process, before its code runs)."""
    _held.clear()
    _held.update(secrets)


def secret(name: str) -> bytes | None:
    """The secret ``name`` this process was handed, or None."""
    return _held.get(name)
