"""``hydra.launcher.fuse=auto``: queued jobs started together, so that their fits train as one.

    plan ──► seated(plan, fuse_max): each slot a seat per member, sharing its device and cores
    queue ──► FusedGroups.take(queue, free seats, more may come?) ──► up to fuse_max jobs
          ──► enroll: each job's env names the group's dir, its size, the job's key there
    a member's job ends ──► ended(job): ``left-<key>`` in the dir (a job that never reached
                            its fit does not keep the group's leader waiting)

Which of them fuse is decided in the jobs, at their fits (``fusion.coordinator``): the first
to arrive leads, trains the members that can share a group, and tells the others why not.
Only the leader computes; the others wait on a socket, so a slot's seats cost it no cores.
Nothing here imports torch.
"""

from __future__ import annotations

import collections
import itertools
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from furcate_hydra import env_vars
from furcate_hydra.execution.job import Job
from furcate_hydra.execution.slots import SlotPlan

__all__ = ["FusedGroups", "seated"]

_GROUP_VARS = (
    env_vars.FUSE_DIR,
    env_vars.FUSE_SIZE,
    env_vars.FUSE_KEY,
    env_vars.FUSE_MAX,
    env_vars.FUSE_TIMEOUT_S,
)


def seated(plan: SlotPlan, fuse_max: int) -> SlotPlan:
    """``plan`` with ``fuse_max`` seats per slot: a group's members run at once, each its own
    process, on one slot's device and cores (in slot order, so a group fills one slot)."""
    if fuse_max <= 1:
        return plan
    seats = [
        replace(slot, index=slot.index * fuse_max + seat, home=slot.index)
        for slot in plan.slots
        for seat in range(fuse_max)
    ]
    return replace(plan, slots=tuple(seats), seats_per_slot=fuse_max)


class FusedGroups:
    """Forms the groups of a pool's queue and keeps their directories."""

    def __init__(self, fuse_max: int, gather_s: float) -> None:
        self.fuse_max = fuse_max
        self.gather_s = gather_s
        self._root: Path | None = None
        self._numbers = itertools.count()

    def take(
        self, queue: collections.deque[Job], free: int, more_may_come: bool, running: bool
    ) -> list[Job]:
        """The next group from the front of ``queue``, or none yet.

        While more jobs may be queued (the caller is submitting), only a full group of
        ``fuse_max`` starts; then the queue is shared evenly between the slots free for it
        (16 jobs on 2 free slots: two groups of 8). A group starts only once seats for all of
        it are free, unless nothing runs that could free more.
        """
        if not queue or (len(queue) < self.fuse_max and more_may_come):
            return []
        want = self.fuse_max
        if not more_may_come:  # the jobs there are, evenly over the slots free for them
            slots = max(1, free // self.fuse_max)
            want = min(self.fuse_max, -(-len(queue) // slots))
        if free < want:
            if running or free == 0:
                return []
            want = free
        group = [queue.popleft() for _ in range(want)]
        self._enroll(group)
        return group

    def _enroll(self, group: list[Job]) -> None:
        for job in group:
            for name in _GROUP_VARS:
                job.env.pop(name, None)  # of an earlier attempt's group
        if len(group) < 2:
            return  # alone: its fit is its own
        directory = self._directory()
        for job in group:
            job.env.update(
                {
                    env_vars.FUSE_DIR: str(directory),
                    env_vars.FUSE_SIZE: str(len(group)),
                    env_vars.FUSE_KEY: job.key,
                    env_vars.FUSE_MAX: str(self.fuse_max),
                    env_vars.FUSE_TIMEOUT_S: repr(self.gather_s),
                }
            )

    def ended(self, job: Job) -> None:
        """The job's process ended: if it had not joined its group, it never will."""
        directory = job.env.get(env_vars.FUSE_DIR)
        if directory is not None and Path(directory).is_dir():
            (Path(directory) / f"{env_vars.FUSE_LEFT}{job.key}").touch()

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def _directory(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="furcate-fused-"))
        directory = self._root / f"group-{next(self._numbers)}"
        directory.mkdir()
        return directory
