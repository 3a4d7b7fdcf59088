"""The slot feed that launch() and both sweepers drive: what it submits when, over a fake
launcher whose jobs end when the test says."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hydra.core.utils import JobReturn

from furcate_hydra.launching.slot_feed import FeedPace, JobSource, SlotFeed
from furcate_hydra.launching.streaming import LOOKUP_CHUNK, JobRequest, JobRun


class FakeTarget:
    """Submitted jobs end one per ``wait_any`` (the oldest), or at once where ``at_once``."""

    def __init__(self, at_once: bool = False, elsewhere: Sequence[int] = ()) -> None:
        self.at_once = at_once
        self.elsewhere = {str(num) for num in elsewhere}
        self.calls: list[tuple[str, object]] = []
        self.running: list[str] = []
        self.batches: list[list[str]] = []
        self.slot_count = 2  # what a launcher's open slots are now

    def submit_batch(self, jobs: Sequence[JobRequest]) -> list[str]:
        keys = [str(job.num) for job in jobs]
        self.calls.append(("submit", keys))
        self.batches.append(keys)
        self.running += keys
        return keys

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        self.calls.append(("wait", timeout))
        if self.at_once:
            done, self.running = self.running, []
        elif timeout == 0 or not self.running:
            done = []
        else:
            done, self.running = self.running[:1], self.running[1:]
        return [(key, JobReturn()) for key in done]

    def job_run(self, key: str) -> JobRun:
        return JobRun(None, elsewhere=key in self.elsewhere)


class Numbers(JobSource[int]):
    def __init__(self, count: int) -> None:
        self.left = list(range(count))
        self.ended_nums: list[int] = []
        self.rounds = 0

    def has_more(self) -> bool:
        return bool(self.left)

    def take(self, count: int) -> list[tuple[JobRequest, int]]:
        taken, self.left = self.left[:count], self.left[count:]
        return [(JobRequest([], num), num) for num in taken]

    def ended(self, item: int, key: str, job_return: JobReturn) -> None:
        self.ended_nums.append(item)

    def round_done(self) -> None:
        self.rounds += 1


def submits(target: FakeTarget) -> list[int]:
    return [len(keys) for keys in target.batches]


def test_a_whole_batch_is_submitted_in_chunks_the_first_filling_the_slots() -> None:
    target, source = FakeTarget(), Numbers(2 + LOOKUP_CHUNK + 5)
    SlotFeed(target, source, FeedPace(2, ahead=None)).run()
    assert submits(target) == [2, LOOKUP_CHUNK, 5]
    assert target.calls[1] == ("wait", 0)  # each chunk: what ended at once taken first
    assert sorted(source.ended_nums) == list(range(2 + LOOKUP_CHUNK + 5))


def test_slots_then_one_ahead_each_as_jobs_end() -> None:
    target, source = FakeTarget(), Numbers(7)
    SlotFeed(target, source, FeedPace(2, ahead=2)).run()
    # the slots first, then two ahead of them; then one for each job that ends
    assert submits(target)[:3] == [2, 2, 1]
    assert source.ended_nums == list(range(7))
    assert source.rounds == len([c for c in target.calls if c[0] == "wait"])


def test_a_job_waiting_elsewhere_holds_a_slot_only_where_the_pace_says() -> None:
    # job 0 waits while another launcher runs its config: does job 1 start before it ends?
    for holds, after_the_first in [(True, ("wait", None)), (False, ("submit", ["1"]))]:
        target = FakeTarget(elsewhere=[0])
        pace = FeedPace(1, ahead=0, elsewhere_holds_room=holds)
        SlotFeed(target, Numbers(3), pace).run()
        assert target.calls[:2] == [("submit", ["0"]), ("wait", 0)]
        assert target.calls[2] == after_the_first


def test_chunks_grow_while_they_come_back_whole_at_once() -> None:
    target = FakeTarget(at_once=True)
    SlotFeed(target, Numbers(40), FeedPace(2, ahead=0, grow_on_skips=True)).run()
    assert submits(target) == [2, 4, 8, 16, 10]
    target = FakeTarget(at_once=True)
    SlotFeed(target, Numbers(6), FeedPace(2, ahead=0)).run()
    assert submits(target) == [2, 2, 2]


def test_a_pace_that_follows_open_slots_grows_as_the_launcher_opens_more() -> None:
    class Widening(FakeTarget):
        """Its slots double after the first job ends (fused groups grow wider)."""

        def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
            done = super().wait_any(timeout)
            if done:
                self.slot_count = 4
            return done

    for follows, first_submits in [(True, [2, 3]), (False, [2, 1])]:
        target = Widening()
        pace = FeedPace(2, ahead=0, follow_open_slots=follows)
        SlotFeed(target, Numbers(8), pace).run()
        # 2 in flight, one ends: the room is the open slots (4) less the one still running
        assert submits(target)[:2] == first_submits, follows


class TakingBack(Numbers):
    """Takes back a batch that failed to submit (a grid whose files were edited broken)."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.refused_items: list[int] = []

    def refused(self, items: Sequence[int], error: Exception) -> bool:
        self.refused_items = list(items)
        self.left = [*items, *self.left]
        return True


class FailOnce(FakeTarget):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def submit_batch(self, jobs: Sequence[JobRequest]) -> list[str]:
        if not self.failed:
            self.failed = True
            raise ValueError("the files do not compose")
        return super().submit_batch(jobs)


def test_a_batch_taken_back_is_submitted_again_and_skips_its_round() -> None:
    target, source = FailOnce(), TakingBack(2)
    SlotFeed(target, source, FeedPace(2)).run()
    assert source.refused_items == [0, 1]
    assert submits(target) == [2]
    assert source.ended_nums == [0, 1]
    assert source.rounds == 3  # not the refused one: its wait and its edits come next round


def test_a_refused_batch_ends_the_feed_and_is_unended() -> None:
    source = Numbers(3)
    feed = SlotFeed(FailOnce(), source, FeedPace(2))
    with pytest.raises(ValueError, match="compose"):
        feed.run()
    assert feed.unended() == [0, 1]
