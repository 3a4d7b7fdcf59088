"""Whether a file on this machine is on a disk that a Slurm cluster's nodes share.

A sqlite store is one file: allocations on other nodes reach it only through a network file
system. The nodes are this machine itself (a single-node cluster), or the file system is one
of the network kinds; anything else is this machine's own disk.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskView", "cluster_nodes", "disk_of", "shared_with_nodes"]

# File systems whose files every node that mounts them sees (a kernel's name in /proc/mounts)
NETWORK_FILE_SYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "cifs",
        "smb3",
        "glusterfs",
        "fuse.glusterfs",
        "panfs",
        "wekafs",
        "fuse.juicefs",
        "orangefs",
    }
)


@dataclass(frozen=True)
class DiskView:
    """Where a path lives: its mount point, its file system type, and whether that is one of
    the network file systems (``NETWORK_FILE_SYSTEMS``)."""

    mount: str
    fs_type: str = "unknown"
    networked: bool = False

    @classmethod
    def of(cls, mount: str, fs_type: str) -> DiskView:
        return cls(mount, fs_type, fs_type in NETWORK_FILE_SYSTEMS)


def disk_of(path: Path, mounts: str | None = None) -> DiskView:
    """The mount that holds ``path`` (the longest mount point above it), from /proc/mounts."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return DiskView("/")
    target = os.path.realpath(path)
    best = DiskView("/")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best.mount):
            best = DiskView.of(mount, fields[2])
    return best


def cluster_nodes(partition: str | None) -> list[str]:
    """The nodes jobs of ``partition`` (None: every partition) may run on, by ``sinfo``;
    [] where sinfo does not answer."""
    command = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})


def shared_with_nodes(path: Path, nodes: list[str]) -> bool:
    """Whether every node sees ``path``: they are all this machine, or its disk is networked."""
    here = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    if nodes and set(nodes) <= here:
        return True
    return disk_of(path).networked
