"""This process and the host's memory, as Linux's ``/proc`` and cgroups tell it: what the
process holds (resident size), its peak since a restart, and what it may still take: the
kernel's ``MemAvailable``, or less where a memory cgroup bounds it (a container's limit, a
Slurm job's allocation).

Inside a container or a Slurm step ``/proc/meminfo`` describes the whole machine, but the OOM
killer acts at the cgroup's limit. So the headroom is also read from the process's memory
cgroup and each of its ancestors up to the mount: cgroup v2 (``memory.max``, ``memory.current``)
or v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``), the file cache the kernel can
drop first (``inactive_file`` in ``memory.stat``) not counted as used. The smallest headroom
wins. Where a container shows its own cgroup as the mount's root, the path
``/proc/self/cgroup`` names is not there and the root is read instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["available_bytes", "peak_resident_bytes", "resident_bytes", "restart_peak"]

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value; anything this
# large is no bound on any machine
_UNLIMITED = 1 << 60


def available_bytes(
    proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes this process may still take (None: neither ``MemAvailable`` nor a cgroup says)."""
    bounds = [b for b in (_mem_available(proc), *_cgroup_headrooms(proc, cgroups)) if b is not None]
    return min(bounds) if bounds else None


def resident_bytes(proc: Path = Path("/proc")) -> int:
    """This process's resident size now (0: unknown)."""
    return (_field(proc / "self" / "status", "VmRSS:") or 0) * 1024


def peak_resident_bytes(proc: Path = Path("/proc")) -> int:
    """This process's peak resident size since it started or ``restart_peak`` (0: unknown)."""
    return (_field(proc / "self" / "status", "VmHWM:") or 0) * 1024


def restart_peak(proc: Path = Path("/proc")) -> bool:
    """Start the peak resident size again from now; False: it cannot be here."""
    try:
        (proc / "self" / "clear_refs").write_text("5")  # Linux: resets VmHWM to VmRSS
    except OSError:
        return False
    return True


def _mem_available(proc: Path) -> int | None:
    kib = _field(proc / "meminfo", "MemAvailable:")
    return None if kib is None else kib * 1024


def _cgroup_headrooms(proc: Path, cgroups: Path) -> Iterator[int | None]:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)  # hierarchy id : controllers : path
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # the v2 hierarchy ("0::/path")
            yield from _headrooms(cgroups, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            yield from _headrooms(
                cgroups / "memory",
                path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )


def _headrooms(mount: Path, path: str, limit: str, usage: str, cache: str) -> Iterator[int | None]:
    """Limit minus usage (less droppable cache) for the cgroup at ``path`` and its ancestors."""
    own = mount / path.strip("/")
    folder = own if own.is_dir() else mount  # a namespaced view: the cgroup is the root
    while True:
        yield _headroom(folder, limit, usage, cache)
        if folder == mount or mount not in folder.parents:
            return
        folder = folder.parent


def _headroom(folder: Path, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    limit, usage = _number(folder / limit_file), _number(folder / usage_file)
    if limit is None or usage is None or limit >= _UNLIMITED:
        return None
    droppable = _field(folder / "memory.stat", f"{cache_key} ") or 0
    return max(0, limit - max(0, usage - droppable))


def _number(path: Path) -> int | None:
    """The integer a cgroup file holds; None: absent, unreadable, or ``max`` (no limit)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _field(path: Path, prefix: str) -> int | None:
    """The first number on the line of ``path`` that starts with ``prefix``."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(prefix):
                return int(line[len(prefix) :].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None
