"""Who is at the other end of a group's socket: the kernel's word (``SO_PEERCRED``), checked
before a byte is read from it.

A member is a process of the sweep's user, forked by the same fork server as the process
checking it (every job of a sweep on this machine is a child of its fork server). The
kernel records the peer's pid and uid when it connects (or, for the leader, when it listened),
so neither can be claimed. Another user's process, or one of this user's that is not a job of
the sweep (a shell, another sweep's job), is refused at once.
"""

from __future__ import annotations

import os
import socket
import struct

import psutil

__all__ = ["peer_pid", "peer_refusal"]

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _credentials(sock: socket.socket) -> tuple[int, int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    pid, uid, gid = _CREDENTIALS.unpack(raw)
    return pid, uid, gid


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of ``sock``, as the kernel recorded it."""
    return _credentials(sock)[0]


def _parent(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).ppid())
    except psutil.Error:  # gone already
        return None


def peer_refusal(sock: socket.socket, expected_pid: int | None = None) -> str | None:
    """Why the process at the other end of ``sock`` is not one of this sweep's jobs, or None.

    ``expected_pid``: the one process it must be (a follower knows its leader's).
    """
    pid, uid, _ = _credentials(sock)
    if uid != os.getuid():
        return f"its process (pid {pid}) runs as uid {uid}, not as this sweep's ({os.getuid()})"
    if expected_pid is not None and pid != expected_pid:
        return f"pid {pid} answered, not the group's leader (pid {expected_pid})"
    parent = _parent(pid)
    if parent != os.getppid():
        return (
            f"its process (pid {pid}, child of {parent}) is not a job of this sweep (the "
            f"sweep's jobs are children of pid {os.getppid()})"
        )
    return None
