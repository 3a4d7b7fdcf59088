"""Refusals and warnings said once per who or what they are about: a peer that keeps trying
(a scanner, a stale job) cannot flood a sweep's log."""

from __future__ import annotations

import threading
from collections.abc import Hashable

__all__ = ["SaidOnce"]


class SaidOnce:
    """Remembers what was said about whom; safe from several threads (a server's)."""

    def __init__(self) -> None:
        self._said: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, about: Hashable) -> bool:
        """True the first time it is asked ``about`` this, False after."""
        with self._lock:
            if about in self._said:
                return False
            self._said.add(about)
            return True
