"""The grid sweeper's queue: what an edit of the grid does to configs not yet run."""

from __future__ import annotations

from furcate_hydra.sweeping.sweep_queue import SweepQueue


def grid(*values: int) -> list[list[str]]:
    return [[f"i={v}"] for v in values]


def test_take_hands_out_in_grid_order_and_never_twice() -> None:
    queue = SweepQueue(grid(0, 1, 2, 0))  # a repeated config is one config
    assert len(queue) == 3
    assert queue.take(2) == [("i=0",), ("i=1",)]
    assert queue.take(5) == [("i=2",)]
    assert queue.take(1) == []
    assert queue.taken == 3


def test_edit_adds_new_drops_removed_and_keeps_taken_ones_out() -> None:
    queue = SweepQueue(grid(0, 1, 2, 3, 4))
    queue.take(2)  # 0 and 1 started (running or finished)
    change = queue.replace_grid(grid(0, 3, 5, 2, 6))
    assert change.added == (("i=5",), ("i=6",))
    assert change.dropped == (("i=4",),)
    assert change.already_taken == 1  # i=0 is in the new grid but never runs again
    assert queue.waiting == (("i=3",), ("i=5",), ("i=2",), ("i=6",))  # the new grid's order
    assert bool(change)


def test_removing_then_restoring_a_queued_config_queues_it_again() -> None:
    queue = SweepQueue(grid(0, 1, 2))
    queue.take(1)
    queue.replace_grid(grid(0, 1))
    change = queue.replace_grid(grid(0, 1, 2))
    assert change.added == (("i=2",),)  # it never ran, so it may run
    assert queue.waiting == (("i=1",), ("i=2",))


def test_an_edit_that_changes_nothing_is_falsy() -> None:
    queue = SweepQueue(grid(0, 1))
    assert not queue.replace_grid(grid(0, 1))


def test_put_back_returns_configs_to_the_front_untaken() -> None:
    queue = SweepQueue(grid(0, 1, 2))
    taken = queue.take(2)
    queue.put_back(taken)
    assert queue.waiting == (("i=0",), ("i=1",), ("i=2",))
    assert queue.taken == 0
