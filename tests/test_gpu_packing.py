"""How many jobs a GPU runs at a time, on its own: when auto opens a slot (memory, then
throughput), when any count loses one (an out-of-memory beside other jobs)."""

from __future__ import annotations

import pytest

from furcate_hydra.execution.gpu.packing import (
    GIB,
    SETTLE_S,
    SOURCE_PROCESS,
    SOURCE_REPORT,
    GpuPacking,
)
from furcate_hydra.execution.gpu.throughput import READINGS
from furcate_hydra.execution.slot_book import SlotBook
from furcate_hydra.execution.slot_options import SlotOptions
from furcate_hydra.execution.slots import GpuStart, Slot, plan_slots
from furcate_hydra.launching.backends import gpu_packing


def packing(
    budget_gib: float = 10,
    start: int = 1,
    ceiling: int = 8,
    margin: float = 0.5,
    rated: bool = False,
    said: list[str] | None = None,
) -> GpuPacking:
    """One GPU; unless ``rated``, its jobs give no rate, so memory alone decides."""
    p = GpuPacking(
        {"0": GpuStart(start, int(budget_gib * GIB))},
        {"0": ceiling},
        int(margin * GIB),
        say=None if said is None else said.append,
    )
    if not rated:
        p.unrated("0")
    return p


def settle(p: GpuPacking, key: str, gib: float, at: float = 0.0) -> None:
    """The job is seen at ``gib`` until its peak counts as learned."""
    p.sample(key, int(gib * GIB), SOURCE_PROCESS, at=at)
    p.sample(key, int(gib * GIB), SOURCE_PROCESS, at=at + SETTLE_S)


def options_of(**given: object) -> SlotOptions:
    """Slot options: every GPU, one job each, no cap, unpinned, CPU allowed, but ``given``."""
    fields: dict[str, object] = {
        "gpus": None,
        "jobs_per_gpu": None,
        "gpu_mem_per_job_gb": None,
        "max_jobs_per_gpu": None,
        "max_workers": None,
        "cpus_per_job": None,
        "allow_cpu": True,
    }
    return SlotOptions(**{**fields, **given})  # type: ignore[arg-type]


def rate(p: GpuPacking, jobs: int, value: float) -> None:
    """Enough readings of the GPU's steps/s at ``jobs`` jobs for the rate to count."""
    for _ in range(READINGS):
        p.rate("0", jobs, value, "steps/s")


def test_a_gpu_opens_slots_while_measured_peaks_plus_one_more_fit() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    assert p.capacity("0") == 1
    p.sample("a", 2 * GIB, SOURCE_PROCESS, at=0.0)
    p.sample("a", 2 * GIB, SOURCE_PROCESS, at=SETTLE_S - 0.1)
    assert p.capacity("0") == 1 and not p.take_growth()  # not held for SETTLE_S yet
    settle(p, "a", 2)
    # 2 GiB per job, 0.5 GiB margin, 10 GiB: a, then idle slots at 2 GiB each, while
    # held + 2 + 0.5 <= 10 -> 4 at a time (4 * 2 + 2 + 0.5 > 10)
    assert p.capacity("0") == 4
    assert p.take_growth() and not p.take_growth()
    assert p.lines() == [f"GPU 0: 4 at a time, peak 2.0 GiB per job ({SOURCE_PROCESS})"]


def test_a_running_job_counts_at_its_own_peak_when_it_is_larger() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    settle(p, "a", 2)  # 4 open
    for key in "bcd":
        p.started(key, "0")
    p.sample("b", 5 * GIB, SOURCE_PROCESS)  # b grows past the learned peak: nothing opens
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
        f"GPU 0: 3 at a time, peak 2.0 GiB per job ({SOURCE_PROCESS}) (at most 4), "
        "1 out-of-memory back-off"
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
    p.sample("a", int(9.5 * GIB), SOURCE_PROCESS)
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
    p.sample("x", 100, SOURCE_PROCESS)
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
    options = options_of(jobs_per_gpu="auto", max_jobs_per_gpu=4, max_workers=3)
    plan = plan_slots(options, environ={}, probe=_Probe(), available_cpus=[0, 1])
    assert [slot.device for slot in plan.slots] == ["0", "1", "0"]  # interleaved, capped
    p = gpu_packing(plan, options)
    assert p is not None and p.open_slots() == 2
    p.unrated("0")
    p.unrated("1")
    p.started("a", "0")
    settle(p, "a", 1)  # 16 GiB would take many: GPU 0 has 2 slots, GPU 1 one
    assert (p.capacity("0"), p.capacity("1")) == (2, 1)
    assert "jobs_per_gpu=auto: 1 at first, up to 2/1" in plan.describe()


def test_auto_opens_one_slot_at_a_time_while_each_job_added_pays() -> None:
    p = packing(budget_gib=100, ceiling=16, rated=True)
    p.started("a", "0")
    settle(p, "a", 1)
    assert p.capacity("0") == 1  # memory has room, but the rate at 1 is not known yet
    rate(p, 1, 100.0)
    assert p.capacity("0") == 2 and p.take_growth()
    rate(p, 2, 190.0)  # +90 %
    assert p.capacity("0") == 3
    rate(p, 3, 270.0)  # +42 %
    assert p.capacity("0") == 4
    rate(p, 4, 275.0)  # +2 %: the 4th did not pay; its slot closes
    assert p.capacity("0") == 3
    assert p.lines() == [
        f"GPU 0: 3 at a time, peak 1.0 GiB per job ({SOURCE_PROCESS}) (at most 4): "
        "the 4th added +2 % steps/s (< 5 %)"
    ]
    rate(p, 3, 400.0)  # a later, faster phase does not reopen what did not pay
    assert p.capacity("0") == 3
    assert p.snapshot()["0"]["stopped_because"] == "the 4th added +2 % steps/s (< 5 %)"


def test_a_rate_needs_readings_before_it_decides() -> None:
    p = packing(budget_gib=100, rated=True)
    p.started("a", "0")
    settle(p, "a", 1)
    for _ in range(READINGS - 1):
        p.rate("0", 1, 100.0, "steps/s")
    assert p.capacity("0") == 1
    p.rate("0", 1, 100.0, "steps/s")
    assert p.capacity("0") == 2


def test_memory_still_bounds_what_throughput_would_open() -> None:
    p = packing(budget_gib=5, rated=True)  # 2 GiB a job: two fit (2 + 2 + 0.5 <= 5)
    p.started("a", "0")
    settle(p, "a", 2)
    rate(p, 1, 100.0)
    rate(p, 2, 200.0)
    assert p.capacity("0") == 2


def test_the_gain_asked_for_is_the_users() -> None:
    p = GpuPacking({"0": GpuStart(1, 100 * GIB)}, {"0": 8}, 0, min_gain=0.5)
    p.started("a", "0")
    settle(p, "a", 1)
    rate(p, 1, 100.0)
    rate(p, 2, 140.0)  # +40 % < 50 %
    assert p.capacity("0") == 1
    assert "the 2nd added +40 % steps/s (< 50 %)" in p.lines()[0]


def test_a_gain_of_0_leaves_memory_alone_to_decide() -> None:
    p = GpuPacking({"0": GpuStart(1, 10 * GIB)}, {"0": 8}, int(0.5 * GIB), min_gain=0)
    p.started("a", "0")
    settle(p, "a", 2)
    assert p.capacity("0") == 4  # no rate was read


def test_a_peak_that_grows_after_it_was_learned_is_learned_again() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    settle(p, "a", 1)  # 1 GiB a job: many fit
    p.sample("a", 3 * GIB, SOURCE_PROCESS, at=10.0)  # late growth, not held long yet
    p.ended("a")
    assert p.snapshot()["0"]["peak_gib_per_job"] == pytest.approx(3.0)


def test_a_short_job_is_learned_from_its_last_reading_at_its_end() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    p.sample("a", 2 * GIB, SOURCE_PROCESS, at=0.0)  # one reading, not held for SETTLE_S
    assert p.capacity("0") == 1
    p.ended("a")
    assert p.capacity("0") == 4


def test_a_job_nvml_never_matched_is_learned_from_its_own_figures() -> None:
    p = packing(budget_gib=10)
    p.started("a", "0")
    p.ended("a", reported_bytes=2 * GIB)
    assert p.capacity("0") == 4
    assert p.lines() == [f"GPU 0: 4 at a time, peak 2.0 GiB per job ({SOURCE_REPORT})"]


def test_a_job_that_ended_before_anything_was_read_leaves_auto_where_it_was_once() -> None:
    said: list[str] = []
    p = packing(budget_gib=10, said=said)
    for key in "ab":
        p.started(key, "0")
        p.ended(key)
    assert p.capacity("0") == 1
    assert len(said) == 1
    assert "ended before its GPU memory could be read" in said[0]
    assert "GPU 0 stays at 1 at a time" in said[0]


def test_a_fixed_count_loses_a_slot_to_an_out_of_memory_beside_others_and_never_grows() -> None:
    p = GpuPacking({"0": GpuStart(4, 0)}, {"0": 4}, 0, grows=False)
    for key in "abcd":
        p.started(key, "0")
    assert p.lines() == []  # a fixed count has nothing to say until it backs off
    verdict = p.out_of_memory("d")
    assert verdict.queue_again and "now runs 3 at a time for the rest of the sweep" in verdict.why
    p.ended("d")
    p.sample("a", GIB, SOURCE_PROCESS)
    p.ended("a", reported_bytes=GIB)
    assert p.capacity("0") == 3
    assert p.lines() == ["GPU 0: 3 at a time (at most 4), 1 out-of-memory back-off"]


def test_a_fixed_count_alone_on_its_gpu_fails_with_the_reason() -> None:
    p = GpuPacking({"0": GpuStart(2, 0)}, {"0": 2}, 0, grows=False)
    p.started("a", "0")
    verdict = p.out_of_memory("a")
    assert not verdict.queue_again and "alone on GPU 0" in verdict.why


def test_every_local_gpu_plan_is_packed_and_a_cpu_plan_is_not() -> None:
    fixed = options_of(gpus=[0], jobs_per_gpu=3)
    plan = plan_slots(fixed, environ={}, probe=_Probe(), available_cpus=[0, 1])
    p = gpu_packing(plan, fixed)
    assert p is not None and not p.grows and p.capacity("0") == 3
    cpu = options_of(gpus=[])
    assert gpu_packing(plan_slots(cpu, environ={}, available_cpus=[0, 1]), cpu) is None


@pytest.mark.parametrize(
    ("cores", "cpus_per_job", "cap", "slots"),
    [(16, None, None, 8), (16, 2, None, 4), (16, None, 32, 32), (1, None, None, 1)],
)
def test_auto_gets_as_many_slots_as_the_cores_drive_unless_capped(
    cores: int, cpus_per_job: int | None, cap: int | None, slots: int
) -> None:
    options = options_of(jobs_per_gpu="auto", max_jobs_per_gpu=cap, cpus_per_job=cpus_per_job)
    plan = plan_slots(options, environ={}, probe=_Probe(), available_cpus=list(range(cores)))
    assert plan.slots_per_gpu() == {"0": slots, "1": slots}  # two GPUs share the cores
