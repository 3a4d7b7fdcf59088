"""The configs of a grid sweep still to run, and what an edit of the grid does to them.

A config is its tuple of overrides. Once taken (handed to the launcher) a config belongs to
the sweep for good: an edit never takes back a running one and never queues a finished one
again. An edit only reorders, adds to and drops from what is still waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["GridChange", "SweepQueue"]

Config = tuple[str, ...]


@dataclass(frozen=True)
class GridChange:
    """What replacing the grid did to the queue."""

    added: tuple[Config, ...]
    dropped: tuple[Config, ...]
    # configs of the new grid already taken (running or finished), so not queued again
    already_taken: int

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped)


class SweepQueue:
    """Grid-ordered configs waiting to run; ``take`` hands them out, ``replace_grid`` edits."""

    def __init__(self, grid: Iterable[Sequence[str]] = ()) -> None:
        self._taken: set[Config] = set()
        self._waiting: list[Config] = list(dict.fromkeys(tuple(c) for c in grid))

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def waiting(self) -> tuple[Config, ...]:
        return tuple(self._waiting)

    @property
    def taken(self) -> int:
        return len(self._taken)

    def take(self, count: int) -> list[Config]:
        """The next ``count`` configs (fewer if fewer wait); they never come back."""
        taken, self._waiting = self._waiting[:count], self._waiting[count:]
        self._taken.update(taken)
        return taken

    def put_back(self, configs: Sequence[Sequence[str]]) -> None:
        """Undo ``take`` for configs that could not be started; they wait first again."""
        back = [tuple(c) for c in configs]
        self._taken.difference_update(back)
        returned = set(back)
        self._waiting = back + [c for c in self._waiting if c not in returned]

    def replace_grid(self, grid: Iterable[Sequence[str]]) -> GridChange:
        """Wait for the new grid's configs not yet taken, in the new grid's order."""
        new = list(dict.fromkeys(tuple(c) for c in grid))
        waiting = [c for c in new if c not in self._taken]
        before = set(self._waiting)
        after = set(waiting)
        change = GridChange(
            added=tuple(c for c in waiting if c not in before),
            dropped=tuple(c for c in self._waiting if c not in after),
            already_taken=len(new) - len(waiting),
        )
        self._waiting = waiting
        return change
