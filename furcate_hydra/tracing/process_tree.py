"""What a job's process tree uses right now: resident memory and CPU time, summed over the tree.

    job pid ──► its descendants (/proc/<pid>/task/<tid>/children, else psutil's scan of every
                process) ──► per process, psutil: RSS and CPU time (one read of its stat files)

A job is the root of its tree (the fork server starts each job in a session of its own); its
DataLoader workers and anything else it starts are its descendants. The kernel's ``children``
files list a process's children directly, so one sample reads a few small files per process of
the job instead of every process on the machine; where a kernel lacks them, psutil's scan is
used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

__all__ = ["TreeUsage", "descendants", "tree_usage"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class TreeUsage:
    """A process tree at one moment.

    Attributes:
        pids: The tree's live processes, its root first.
        rss_bytes: Resident memory summed over them (pages shared between them, such as those
            of the fork server a job was forked from, count in each, as ``top`` shows them).
        cpu_s: CPU time the tree has used: its live processes' own, plus that of descendants
            that ended and were waited for (which the kernel adds to their parent's).
    """

    pids: tuple[int, ...]
    rss_bytes: int
    cpu_s: float


def tree_usage(root: int) -> TreeUsage | None:
    """The usage of ``root``'s tree; None when ``root`` is gone or a zombie (the job ended)."""
    pids = [root, *descendants(root)]
    live: list[int] = []
    rss = 0
    cpu = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                memory = process.memory_info()
                times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between listing and reading, or not ours to read
        live.append(pid)
        rss += int(memory.rss)
        cpu += times.user + times.system + times.children_user + times.children_system
    if not live or live[0] != root:
        return None
    return TreeUsage(tuple(live), rss, cpu)


def descendants(root: int) -> list[int]:
    """Every descendant of ``root`` (children first), as the kernel lists them now."""
    found: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        children = _children(pid)
        found.extend(children)
        stack.extend(children)
    return found


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    children: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                children.extend(int(child) for child in handle.read().split())
        except FileNotFoundError:
            if tid == tasks[0] and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return _children_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue  # the thread ended meanwhile
    return children


def _children_by_scan(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
