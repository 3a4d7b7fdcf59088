"""The one loop that keeps a streaming launcher's slots fed: ``launch()`` and both sweepers.

while the source has jobs left, or jobs are in flight:
    room for more (slots to fill, jobs to have ready ahead of them)? and the source ready?
        ──► take that many from the source ──► submit_batch (one store lookup)
        ──► wait_any(timeout=0): jobs recorded already (skipped) come back at once
    else jobs in flight ──► wait_any until one ends (or the source's wake-up interval)
    else ──► the source waits for what lets it go on (a grid on hold, till its files compose)
    each job that came back ──► source.ended; then source.round_done (edits, the progress view)

The caller enters ``streaming()`` around ``run()``; what each caller keeps of its own (a grid's
live queue, Optuna's ask and tell) is its ``JobSource``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from furcate_hydra.launching.streaming import LOOKUP_CHUNK, JobRequest, JobRun

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn

__all__ = ["FeedPace", "JobSource", "SlotFeed", "SlotTarget"]

Item = TypeVar("Item")


class SlotTarget(Protocol):
    """What the feed drives: a ``StreamingLauncher``, or the launch session behind one."""

    def submit_batch(self, jobs: Sequence[JobRequest]) -> Sequence[str]: ...

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]: ...

    def job_run(self, key: str) -> JobRun: ...

    @property
    def slot_count(self) -> int:
        """Jobs that may run at once now (read only with ``FeedPace.follow_open_slots``)."""
        ...


@dataclass(frozen=True)
class FeedPace:
    """How many jobs a feed keeps submitted.

    Attributes:
        slots: Jobs to run at once; the first chunk fills them.
        ahead: More kept submitted once any is in flight, each ready to start the moment a slot
            frees; None: no bound, every job is submitted as it comes, a chunk of
            ``LOOKUP_CHUNK`` at a time after the first (Hydra's ``launch`` of a whole batch).
        elsewhere_holds_room: Whether a job that waits while another launcher runs its config
            counts against ``slots``; it takes no slot here.
        grow_on_skips: Whether a chunk that came back whole at once (recorded, skipped) doubles
            the next one, up to ``LOOKUP_CHUNK``: a rerun finds whole batches recorded.
        follow_open_slots: Whether ``slots`` grows with the target's ``slot_count`` (fused
            groups whose learned width opens more seats), never below ``slots``.
    """

    slots: int
    ahead: int | None = 0
    elsewhere_holds_room: bool = True
    grow_on_skips: bool = False
    follow_open_slots: bool = False


class JobSource(Generic[Item]):
    """Where a feed takes its jobs and hands back what ended; ``Item`` is the source's own
    record of a job (its number, its trial), handed back with the job's return."""

    # How often a round is wanted while jobs run (to follow edits); None: when one ends.
    wake_every_s: float | None = None

    def has_more(self) -> bool:
        """Whether jobs are left to submit (the feed ends when none are, nor in flight)."""
        raise NotImplementedError

    def take(self, count: int) -> list[tuple[JobRequest, Item]]:
        """Up to ``count`` jobs to submit now, in one batch; fewer, or none, is fine."""
        raise NotImplementedError

    def ended(self, item: Item, key: str, job_return: JobReturn) -> None:
        """A job submitted under ``key`` came back."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the jobs left may be submitted now."""
        return True

    def wait_until_ready(self) -> None:
        """Nothing in flight, jobs left, not ``ready()``: wait a while for what frees them."""

    def refused(self, items: Sequence[Item], error: Exception) -> bool:
        """``submit_batch`` raised for these jobs: True if the source took them back (the
        feed goes on), False to end the feed with the error."""
        return False

    def round_done(self) -> None:
        """After each round of submitting or waiting, and the returns it brought."""


class SlotFeed(Generic[Item]):
    """Submits a source's jobs as the pace allows, hands each return back to the source."""

    def __init__(self, target: SlotTarget, source: JobSource[Item], pace: FeedPace) -> None:
        self.target = target
        self.source = source
        self.pace = pace
        self._in_flight: dict[str, Item] = {}
        self._submitting: list[Item] = []  # taken, not yet in flight (submit_batch raised)
        self._submitted = False
        self._batch: list[str] = []  # the keys of the last chunk submitted
        self._lookahead = 0  # grows while whole chunks come back at once (grow_on_skips)

    def unended(self) -> list[Item]:
        """The jobs taken from the source and not handed back: in flight, or being submitted
        (what a stopped caller must account for)."""
        return [*self._in_flight.values(), *self._submitting]

    def run(self) -> None:
        """Until the source has no job left and none is in flight."""
        source = self.source
        while source.has_more() or self._in_flight:
            done: list[tuple[str, JobReturn]] = []
            room = self._room()
            if room > 0 and source.has_more() and source.ready():
                if not self._submit(max(room, self._lookahead)):
                    continue  # refused and taken back: the source is on hold now
                done = self.target.wait_any(timeout=0)
                self._grow(done)
            elif self._in_flight:
                done = self.target.wait_any(timeout=source.wake_every_s)
            else:
                source.wait_until_ready()
            for key, job_return in done:
                source.ended(self._in_flight.pop(key), key, job_return)
            source.round_done()

    def _room(self) -> int:
        pace = self.pace
        if pace.ahead is None:  # a whole batch: every job, a store lookup per chunk
            return LOOKUP_CHUNK if self._submitted else pace.slots
        held = len(self._in_flight)
        if not pace.elsewhere_holds_room:
            held = sum(1 for key in self._in_flight if not self.target.job_run(key).elsewhere)
        slots = pace.slots
        if pace.follow_open_slots:
            slots = max(slots, self.target.slot_count)
        return (slots + pace.ahead if held else slots) - held

    def _submit(self, count: int) -> bool:
        """Take up to ``count`` jobs and submit them; False if the source took them back."""
        jobs = self.source.take(count)
        self._batch = []
        if not jobs:
            return True
        self._submitting = [item for _, item in jobs]
        try:
            keys = self.target.submit_batch([request for request, _ in jobs])
        except Exception as exc:
            if not self.source.refused(self._submitting, exc):
                raise
            self._submitting = []
            return False
        self._in_flight.update(zip(keys, self._submitting, strict=True))
        self._submitting = []
        self._submitted = True
        self._batch = list(keys)
        return True

    def _grow(self, done: list[tuple[str, JobReturn]]) -> None:
        """The next chunk: twice this one when all of it came back at once, else the room."""
        if not self.pace.grow_on_skips:
            return
        batch = set(self._batch)
        back = sum(1 for key, _ in done if key in batch)
        self._lookahead = min(LOOKUP_CHUNK, 2 * len(batch)) if back == len(batch) else 0
