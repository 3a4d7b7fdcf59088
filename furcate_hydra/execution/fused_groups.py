"""``hydra.launcher.fuse=auto``: queued jobs started together, so that their fits train as one.

    plan ──► seated(plan, seats): each slot a seat per member, sharing its device and cores
    queue ──► FusedGroups.take(queue, free seats, more may come?) ──► up to ``width`` jobs,
              on a slot no other group holds
          ──► enroll: each job's env names the group's dir (mode 0700), its size, the job's
              key there; its memory gets the group's secret (through the fork server)
    a member's job ends ──► ended(job): ``left-<key>`` in the dir (a job that never reached
                            its fit does not keep the group's leader waiting)

Which of them fuse is decided in the jobs, at their fits (``fusion.coordinator``): the first
to arrive leads, trains the members that can share a group, and tells the others why not.
Only the leader computes; the others wait on a socket, so a slot's seats cost it no cores.

The width: ``fuse_max`` where it is set. Unset, it is learned as packing learns jobs per
GPU: groups start ``FIRST_WIDTH`` wide (at most ``LEARNED_SEATS``); each leader measures how
many of its members pay to train at once (``fusion.group_width``) and leaves that in its
directory; a group whose every member still paid doubles the next groups' width, a narrower
answer becomes it. Nothing here imports torch.
"""

from __future__ import annotations

import collections
import itertools
import json
import secrets
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from furcate_hydra import env_vars, job_secrets
from furcate_hydra.execution.job import Job
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.slots import SlotPlan

__all__ = ["FIRST_WIDTH", "LEARNED_SEATS", "FusedGroups", "seated"]

# fuse_max unset: the seats of a slot (the widest a learned group may grow), and the width the
# sweep's first groups start at, before any leader measured
LEARNED_SEATS = 128
FIRST_WIDTH = 16

_GROUP_VARS = (
    env_vars.FUSE_DIR,
    env_vars.FUSE_SIZE,
    env_vars.FUSE_KEY,
    env_vars.FUSE_MAX,
    env_vars.FUSE_TIMEOUT_S,
    env_vars.FUSE_MIN_GAIN,
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
    """Forms the groups of a pool's queue, keeps their directories, learns their width."""

    @classmethod
    def for_pool(cls, options: PoolOptions, slots: int) -> FusedGroups | None:
        """A pool's groups over its ``slots`` (None with ``fuse=off``)."""
        if options.fuse_max <= 1:
            return None
        homes = max(slots // options.fuse_max, 1)
        return cls(options.fuse_max, options.fuse_gather_s, homes, options.fuse_min_gain)

    def __init__(
        self, seats: int, gather_s: float, homes: int, min_gain: float | None = None
    ) -> None:
        """``seats``: per slot; ``homes``: the slots; ``min_gain``: None, groups are ``seats``
        wide; else the width is learned (see the module's doc)."""
        self.seats = seats
        self.gather_s = gather_s
        self.homes = homes
        self.min_gain = min_gain
        self.width = seats if min_gain is None else min(FIRST_WIDTH, seats)
        self._root: Path | None = None
        self._numbers = itertools.count()
        self._group_of: dict[str, int] = {}  # a started job's key -> its group's number
        self._running: dict[int, set[str]] = {}  # a group's number -> its jobs still running
        self._reports: dict[Path, int] = {}  # a learning group's dir -> its entries read

    @property
    def free_homes(self) -> int:
        """Slots no group holds: a group's leader has its slot's cores to itself."""
        return max(self.homes - len(self._running), 0)

    def seats_open(self, seats: int) -> int:
        """Of a pool's ``seats``, those groups of the current width can fill."""
        return min(seats, self.homes * self.width)

    def seats_free(self, idle: int) -> int:
        """Of a pool's ``idle`` seats, those groups of the current width can fill now: on the
        slots no group holds."""
        return min(idle, self.free_homes * self.width)

    def take(
        self, queue: collections.deque[Job], free: int, more_may_come: bool, running: bool
    ) -> list[Job]:
        """The next group from the front of ``queue``, or none yet.

        While more jobs may be queued (the caller is submitting), groups start once the queue
        holds a full group of ``width`` for every free slot; after that the queue is shared
        evenly between the slots free for it (16 jobs on 2 free slots: two groups of 8, not
        one of 16 and an idle slot). A group starts only on a slot no other group holds, once
        seats for all of it are free, unless nothing runs that could free more.
        """
        if not queue or not self.free_homes:
            return []  # (no report is read then: this runs on every submit and wait)
        self._learn()
        width = self.width
        if more_may_come and len(queue) < width * self.free_homes:
            return []
        want = width
        if not more_may_come:  # the jobs there are, evenly over the slots free for them
            want = min(width, -(-len(queue) // self.free_homes))
        if free < want:
            if running or free == 0:
                return []
            want = free
        group = [queue.popleft() for _ in range(want)]
        self._enroll(group)
        return group

    def _enroll(self, group: list[Job]) -> None:
        number = next(self._numbers)
        self._running[number] = {job.key for job in group}
        for job in group:
            self._group_of[job.key] = number
            for name in _GROUP_VARS:
                job.env.pop(name, None)  # of an earlier attempt's group
            job.secrets.pop(job_secrets.FUSED_GROUP, None)
        if len(group) < 2:
            return  # alone: its fit is its own
        directory = self._directory(number)
        # what the members prove to each other before any of them reads what another sent
        secret = secrets.token_bytes(job_secrets.KEY_BYTES)
        learned = {} if self.min_gain is None else {env_vars.FUSE_MIN_GAIN: repr(self.min_gain)}
        if learned:
            self._reports[directory] = 0
        for job in group:
            job.env.update(
                {
                    env_vars.FUSE_DIR: str(directory),
                    env_vars.FUSE_SIZE: str(len(group)),
                    env_vars.FUSE_KEY: job.key,
                    env_vars.FUSE_MAX: str(self.width),
                    env_vars.FUSE_TIMEOUT_S: repr(self.gather_s),
                    **learned,
                }
            )
            job.secrets[job_secrets.FUSED_GROUP] = secret

    def ended(self, job: Job) -> None:
        """The job's process ended: if it had not joined its group, it never will."""
        directory = job.env.get(env_vars.FUSE_DIR)
        if directory is not None and Path(directory).is_dir():
            (Path(directory) / f"{env_vars.FUSE_LEFT}{job.key}").touch()
        number = self._group_of.pop(job.key, None)
        if number is None or number not in self._running:
            return
        self._running[number].discard(job.key)
        if not self._running[number]:  # its last member: what its leader measured is all in
            del self._running[number]
            self._learn()
            if directory is not None:
                self._reports.pop(Path(directory), None)

    def _learn(self) -> None:
        """Take in what leaders measured since: each group's width, and whether every member
        it had still paid (then the next groups may be wider)."""
        for directory, read in list(self._reports.items()):
            try:
                entries = json.loads((directory / env_vars.FUSE_WIDTH_REPORT).read_text())
            except (OSError, ValueError):
                continue  # not measured yet (or being replaced): read it next time
            for entry in entries[read:]:
                self.width = self._next_width(entry)
            self._reports[directory] = len(entries)

    def _next_width(self, entry: dict[str, Any]) -> int:
        members, width = int(entry["members"]), int(entry["width"])
        if entry.get("rising"):
            # every member paid: only a group as wide as the groups are now tells of wider
            return min(2 * self.width, self.seats) if members >= self.width else self.width
        return max(2, min(width, self.seats))

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def _directory(self, number: int) -> Path:
        # mkdtemp makes the root 0700: no other user reaches a group's socket or marks
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="furcate-fused-"))
        directory = self._root / f"group-{number}"
        directory.mkdir(mode=0o700)
        return directory
