"""``jobs_per_gpu=auto``'s second rule: one more job on a GPU must pay in throughput.

    the packing watch (every 0.5 s) ── reading(k jobs, aggregate rate, unit) ──► ThroughputClimb
    GpuPacking, before it opens slot k+1 ──────────────────────────── may_open(k)? ◄──┘
    GpuPacking, after each reading ────────────────────────────────── stop_at() ◄─────┘

A GPU's aggregate rate at k jobs is the sum of its k jobs' training steps per second (from the
progress Lightning jobs write), or its utilisation where its jobs report no progress. Slot k+1
opens only once the rate at k is known and k itself paid: the rate at k grew by at least
``min_gain`` over the rate at k-1. Where it did not, the climb stops at k-1 and says why in
one line; the GPU then runs k-1 at a time for the rest of the sweep.

Rates are medians over ``READINGS`` readings, each taken while the GPU ran exactly k jobs that
all trained (see ``packing_watch``), so one noisy second decides nothing. Nothing here reads a
clock or a GPU: it is fed, and tested, with numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["READINGS", "ThroughputClimb"]

# Readings a level needs before its rate counts (0.5 s apart: a level is judged in ~2 s).
READINGS = 4


@dataclass
class ThroughputClimb:
    """Whether one more job paid on one GPU (see the module doc); the packing's lock guards it.

    Attributes:
        min_gain: The least fraction one more job must add to the aggregate rate; 0: the
            rate is not asked, memory alone decides.
        unit: What the rates count ("steps/s", "% GPU utilisation"); None before a reading.
        stopped: Where the climb stopped (the count that paid last), or None.
        why: The stop in words, for the GPU's line.
        unrated: Whether its jobs give no rate at all (no progress, no utilisation): then
            memory alone decides.
    """

    min_gain: float
    unit: str | None = None
    unrated: bool = False
    stopped: int | None = None
    why: str = ""
    _readings: dict[int, list[float]] = field(default_factory=dict)

    def reading(self, jobs: int, rate: float, unit: str) -> None:
        """One aggregate rate while ``jobs`` jobs ran; a change of unit starts over."""
        self.unrated = False
        if unit != self.unit:
            self.unit, self._readings = unit, {}
        kept = self._readings.setdefault(jobs, [])
        kept.append(rate)
        del kept[: -READINGS * 4]  # the newest only: a long sweep's rates may drift

    def rate(self, jobs: int) -> float | None:
        """The median rate at ``jobs`` jobs, once it has ``READINGS`` readings."""
        kept = self._readings.get(jobs, [])
        return statistics.median(kept) if len(kept) >= READINGS else None

    def may_open(self, jobs: int) -> bool:
        """Whether a GPU running ``jobs`` at a time may open one more slot (memory allowing)."""
        if self.stopped is not None:
            return jobs < self.stopped
        return self.min_gain <= 0 or self.unrated or self.rate(jobs) is not None

    def stop_at(self, jobs: int) -> int | None:
        """Where the climb stops, judged once the rate at ``jobs`` is known: ``jobs - 1``
        when ``jobs`` added less than ``min_gain`` to the rate at ``jobs - 1``, else None."""
        if self.stopped is not None or jobs < 2:
            return self.stopped
        now, before = self.rate(jobs), self.rate(jobs - 1)
        if now is None or before is None or before <= 0:
            return None
        gain = now / before - 1
        if gain >= self.min_gain:
            return None
        self.stopped = jobs - 1
        self.why = (
            f"the {_ordinal(jobs)} added {gain * 100:+.0f} % {self.unit} "
            f"(< {self.min_gain * 100:g} %)"
        )
        return self.stopped


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
