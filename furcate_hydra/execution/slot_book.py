"""Which slot each running job holds, which slots are free, which are offered to jobs ahead.

take_free() ──► hold(job, slot)                      a job started on a free slot
offer() ──► Release ──► accept(slot, job)             a free slot taken by a job forked ahead
                    └─► decline(slot)                 none was left: the slot is free again
hand_on(ended, job)                                   the fork server gave a job ahead the
                                                      slot of a job that ended
release(job)                                          a job ended: its slot is free, unless
                                                      it was handed on

With ``jobs_per_gpu=auto`` a GPU has more slots than it runs jobs at a time: ``capacity``
says how many of a device's slots may be busy now (``GpuPacking``); the others are not free.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from furcate_hydra.execution.slots import Slot

__all__ = ["SlotBook"]


class SlotBook:
    """The slots of a plan and who holds them; owned by the pool's one thread."""

    def __init__(
        self, slots: Sequence[Slot], capacity: Callable[[str | None], int | None] | None = None
    ) -> None:
        """``capacity(device)``: how many of its slots may be busy now; None: all of them."""
        self.slots = tuple(slots)
        self._capacity = capacity
        self._free: list[Slot] = list(slots)
        self._busy_per_device: collections.Counter[str | None] = collections.Counter()
        self._busy_per_home: collections.Counter[int | None] = collections.Counter()
        self._held: dict[str, Slot] = {}  # by job key
        self._offered: dict[int, Slot] = {}  # by slot index: waiting for Started or Unused

    @property
    def free(self) -> int:
        """Free slots a job may take now."""
        if self._capacity is None:
            return len(self._free)
        return sum(1 for _ in self._usable())

    @property
    def offered(self) -> int:
        return len(self._offered)

    def take_free(self, home: int | None = None) -> Slot:
        """A free slot, on the least busy device first; a seat (``Slot.home``) of ``home``
        where one is free (a fused group's jobs share their slot), else of the least busy."""
        usable = self._usable()
        if home is not None and (seats := [s for s in usable if s.home == home]):
            usable = seats
        slot = min(
            usable,
            key=lambda s: (
                self._busy_per_device[s.device],
                self._busy_per_home[s.home],
                s.index,
            ),
        )
        self._free.remove(slot)
        self._busy_per_device[slot.device] += 1
        self._busy_per_home[slot.home] += 1
        return slot

    def hold(self, key: str, slot: Slot) -> None:
        self._held[key] = slot

    def offer(self) -> Slot:
        """A free slot for the oldest job forked ahead (the server picks it)."""
        slot = self.take_free()
        self._offered[slot.index] = slot
        return slot

    def accept(self, index: int, key: str) -> Slot:
        slot = self._offered.pop(index)
        self._held[key] = slot
        return slot

    def decline(self, index: int) -> None:
        self._put_back(self._offered.pop(index))

    def hand_on(self, ended: str, key: str) -> Slot:
        """The slot of a job that ended is ``key``'s now: it is not freed when ``ended``
        is released."""
        slot = self._held.pop(ended)
        self._held[key] = slot
        return slot

    def release(self, key: str) -> None:
        slot = self._held.pop(key, None)
        if slot is not None:
            self._put_back(slot)

    def clear(self) -> None:
        """Nothing runs any more (the pool is broken): no slot is free either."""
        self._free.clear()
        self._held.clear()
        self._offered.clear()

    def _usable(self) -> list[Slot]:
        """The free slots whose device runs fewer jobs than its capacity, as many as it
        has room for."""
        if self._capacity is None:
            return self._free
        room: dict[str | None, int | None] = {}
        usable = []
        for slot in self._free:
            if slot.device not in room:
                cap = self._capacity(slot.device)
                room[slot.device] = (
                    None if cap is None else cap - self._busy_per_device[slot.device]
                )
            left = room[slot.device]
            if left is None or left > 0:
                usable.append(slot)
                if left is not None:
                    room[slot.device] = left - 1
        return usable

    def _put_back(self, slot: Slot) -> None:
        self._busy_per_device[slot.device] -= 1
        self._busy_per_home[slot.home] -= 1
        self._free.append(slot)
