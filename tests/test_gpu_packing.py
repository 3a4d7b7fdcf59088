"""jobs_per_gpu=auto's rule, on its own: when a GPU opens a slot, when it loses one."""

from __future__ import annotations

import pytest

from furcate_hydra.execution.gpu_packing import GIB, SETTLE_SAMPLES, GpuPacking
from furcate_hydra.execution.slot_book import SlotBook
from furcate_hydra.execution.slot_options import SlotOptions
from furcate_hydra.execution.slots import GpuStart, Slot, plan_slots
from furcate_hydra.hydra_layer.backends import gpu_packing

MIB_PER_GIB = 1024


def packing(
    budget_gib: float = 10, start: int = 1, ceiling: int = 8, margin: float = 0.5
) -> GpuPacking:
    return GpuPacking(
        {"0": GpuStart(start, int(budget_gib * GIB))}, {"0": ceiling}, int(margin * GIB)
    )


def settle(p: GpuPacking, key: str, gib: float) -> None:
    """The job is seen at ``gib`` until its peak counts as learned."""
    for _ in range(SETTLE_SAMPLES + 1):
        p.sample(key, gib * MIB_PER_GIB)


def test_a_gpu_opens_slots_while_measured_peaks_plus_one_more_fit() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    assert p.capacity("0") == 1
    p.sample("a", 2 * MIB_PER_GIB)
    assert p.capacity("0") == 1 and not p.take_growth()  # a peak still rising is not learned
    settle(p, "a", 2)
    # 2 GiB per job, 0.5 GiB margin, 10 GiB: a, then idle slots at 2 GiB each, while
    # held + 2 + 0.5 <= 10 -> 4 at a time (4 * 2 + 2 + 0.5 > 10)
    assert p.capacity("0") == 4
    assert p.take_growth() and not p.take_growth()
    assert p.lines() == ["GPU 0: 4 at a time, peak 2.0 GiB per job"]


def test_a_running_job_counts_at_its_own_peak_when_it_is_larger() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    settle(p, "a", 2)  # 4 open
    for key in "bcd":
        p.started(key, "0")
    p.sample("b", 5 * MIB_PER_GIB)  # b grows past the learned peak: nothing opens
    p.ended("a")
    assert p.capacity("0") == 4  # c, d at 2, b at 5, one open at 2: no room for a fifth


def test_the_ceiling_is_the_gpu_s_slots() -> None:
    p = packing(budget_gib=100, ceiling=3)  # max_jobs_per_gpu, or fewer under max_workers
    p.started("a", "0")
    settle(p, "a", 1)
    assert p.capacity("0") == 3
    assert packing(start=5, ceiling=3).capacity("0") == 3  # gpu_mem_per_job_gb's count too


def test_out_of_memory_beside_others_queues_again_and_closes_a_slot_for_good() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    settle(p, "a", 2)
    for key in "bcd":
        p.started(key, "0")
    verdict = p.out_of_memory("d")
    assert verdict.queue_again
    assert "beside 3 other jobs" in verdict.why and "now runs 3 at a time" in verdict.why
    p.ended("d")
    assert p.capacity("0") == 3
    settle(p, "b", 2)  # what would open a fourth slot never does again
    p.ended("b")
    assert p.capacity("0") == 3
    assert p.snapshot()["0"]["oom_backoffs"] == 1
    assert p.lines() == [
        "GPU 0: 3 at a time, peak 2.0 GiB per job (at most 4), 1 out-of-memory back-off"
    ]


def test_a_gpu_never_drops_below_one_slot() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    p.started("b", "0")  # opened by gpu_mem_per_job_gb's count, say
    assert p.out_of_memory("b").queue_again
    p.ended("b")
    assert p.capacity("0") == 1


def test_out_of_memory_alone_on_its_gpu_fails_with_that_reason() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    p.sample("a", 9.5 * MIB_PER_GIB)
    verdict = p.out_of_memory("a")
    assert not verdict.queue_again
    assert "alone on GPU 0" in verdict.why and "9.5 GiB" in verdict.why
    assert "does not fit on this GPU" in verdict.why


def test_a_job_that_ran_beside_another_is_not_alone_though_the_other_ended() -> None:
    p = packing(budget_gib=10, start=2)
    p.started("a", "0")
    p.started("b", "0")
    p.ended("b")
    assert p.out_of_memory("a").queue_again


def test_a_cpu_slot_or_unknown_gpu_is_not_packed() -> None:
    p = packing()
    assert p.capacity(None) is None
    assert p.capacity("7") is None
    p.started("x", "7")  # ignored
    p.sample("x", 100.0)
    p.ended("x")


@pytest.mark.parametrize("capacity", [1, 2])
def test_the_slot_book_hands_out_only_open_slots(capacity: int) -> None:
    slots = [Slot(i, "0", None, None) for i in range(4)] + [Slot(4, "1", None, None)]
    caps: dict[str | None, int] = {"0": capacity, "1": 1}
    book = SlotBook(slots, lambda device: caps.get(device))
    assert book.free == capacity + 1
    taken = [book.take_free() for _ in range(capacity + 1)]
    assert sorted(s.device or "" for s in taken) == sorted(["0"] * capacity + ["1"])
    assert book.free == 0
    for i, slot in enumerate(taken):
        book.hold(str(i), slot)
    caps["0"] = capacity + 1  # the GPU opened one more
    assert book.free == 1 and book.take_free().device == "0"


class _Probe:
    """Two GPUs of 16 GiB, all of it free."""

    def device_ids(self) -> list[str]:
        return ["0", "1"]

    def installed(self) -> None:
        return None

    def free_memory_bytes(self, device_id: str) -> int:
        return 16 * GIB


def test_auto_opens_no_more_slots_than_max_workers_left_a_gpu() -> None:
    options = SlotOptions(
        gpus=None,
        jobs_per_gpu="auto",
        gpu_mem_per_job_gb=None,
        max_jobs_per_gpu=4,
        max_workers=3,
        cpus_per_job=None,
        allow_cpu=True,
    )
    plan = plan_slots(options, environ={}, probe=_Probe(), available_cpus=[0, 1])
    assert [slot.device for slot in plan.slots] == ["0", "1", "0"]  # interleaved, capped
    p = gpu_packing(plan, options)
    assert p is not None and p.open_slots() == 2
    p.started("a", "0")
    settle(p, "a", 1)  # 16 GiB would take many: GPU 0 has 2 slots, GPU 1 one
    assert (p.capacity("0"), p.capacity("1")) == (2, 1)
    assert "jobs_per_gpu=auto: 1 at first, up to 2/1" in plan.describe()
