"""``fuse_max`` unset: how many members train at once is measured by the group's leader, trained
in parts of that width (each part shown its members' own batches), and learned by the launcher
for the groups it starts next."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from furcate_hydra import env_vars
from furcate_hydra.execution.fused_groups import FIRST_WIDTH, LEARNED_SEATS, FusedGroups
from furcate_hydra.execution.job import Job
from furcate_hydra.fusion import group_width
from furcate_hydra.fusion.coordinator import Alone, Offer, Trained, lead
from furcate_hydra.fusion.fit_call import read_fit_call
from furcate_hydra.fusion.group_width import SizeTrial, Width, choose_width, learned_width
from furcate_hydra.fusion.rendezvous import Joined, Leading
from furcate_hydra.fusion.sample_batch import sample_batch
from furcate_hydra.layout import JobPaths
from furcate_hydra.lightning._fused_group import GroupEnv
from tests.option_helpers import parse_launcher_options
from tests.test_fusion_engine import CONFIGS, QUIET, TinyMLP, _loaders, _member


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    warnings.filterwarnings("ignore", module="lightning")


def trials(*steps: tuple[int, float, int]) -> list[SizeTrial]:
    return [SizeTrial(size, seconds, memory, "vmap") for size, seconds, memory in steps]


def test_doubling_goes_on_while_a_members_share_falls_and_the_next_size_fits() -> None:
    # 1 -> 2 -> 4: each member's share fell by 40 % and 33 %: try 8
    assert (
        choose_width(trials((1, 0.010, 10), (2, 0.012, 20), (4, 0.016, 40)), 32, 0.05, 10**6)
        is None
    )
    # 4 -> 8 saved a member 2 %: 4 at a time, and the doubling had stopped paying
    width, why, rising = choose_width(trials((4, 0.016, 40), (8, 0.0314, 80)), 32, 0.05, None) or (
        0,
        "",
        True,
    )
    assert (width, rising) == (4, False)
    assert why == "from 4 to 8 a member's share of a step fell 2%, less than the 5% asked"
    # every member measured and each doubling paid: all of them, and it was still rising
    assert choose_width(trials((2, 0.010, 0), (3, 0.012, 0)), 3, 0.05, None) == (
        3,
        "every member fits and each doubling paid",
        True,
    )
    # 8 would need ~2 x 300 MiB of the 500 MiB free: stop at 4
    width, why, _ = choose_width(trials((4, 0.010, 300 * 2**20)), 32, 0.05, 500 * 2**20) or (
        0,
        "",
        1,
    )
    assert width == 4 and why == "8 would take ~600 MiB, more than the 500 MiB free"
    # a step of seconds has no per-step overhead left for fusion to save
    width, why, _ = choose_width(trials((1, 0.6, 0), (2, 1.1, 0)), 32, 0.05, None) or (0, "", 1)
    assert width == 2 and why.startswith("a step of 2 takes 1.1 s")
    # never narrower than 2: those configs were gathered to train together
    assert choose_width(trials((1, 0.010, 0), (2, 0.025, 0)), 8, 0.05, None) == (
        2,
        "from 1 to 2 a member's share of a step rose 25%, less than the 5% asked",
        False,
    )


def _members(count: int, width: int = 16) -> tuple[list[TinyMLP], list[torch.optim.Optimizer]]:
    modules: list[TinyMLP] = []
    for index in range(count):
        torch.manual_seed(index)
        module = TinyMLP(1e-3 * (index + 1), 0.0)
        module.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 3))
        modules.append(module)
    return modules, [m.configure_optimizers() for m in modules]


def test_the_width_is_measured_on_copies_leaving_the_members_and_their_streams_as_they_were() -> (
    None
):
    modules, optimizers = _members(6)
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
    batch = sample_batch(_loaders()[0])
    torch.manual_seed(7)
    stream = torch.get_rng_state()
    # no gain asked (-inf): the doubling goes on whatever the timings of a busy machine say
    width = learned_width(modules, optimizers, batch, 1, torch.device("cpu"), float("-inf"))
    assert [t.size for t in width.trials] == [1, 2, 4, 6]  # doubling, up to the members there are
    assert all(t.seconds > 0 and t.mode in ("vmap", "loop") for t in width.trials)
    assert 2 <= width.width <= 6 and width.mode in ("vmap", "loop")
    assert width.describe(6).startswith(f"6 member(s) train {width.width} at a time (")
    assert torch.equal(torch.get_rng_state(), stream)
    for module, weights, optimizer in zip(modules, before, optimizers, strict=True):
        assert all(torch.equal(module.state_dict()[k], v) for k, v in weights.items())
        assert not optimizer.state  # its fused copy stepped, not it


def test_the_memory_a_wider_group_would_take_beyond_whats_free_stops_the_doubling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1M parameters a member: each doubling's memory shows in the process's peak resident size
    modules, optimizers = _members(8, width=1 << 16)
    batch = sample_batch(_loaders()[0])
    monkeypatch.setattr(group_width, "MEMORY_SHARE", 1e-9)  # a few bytes "free"
    width = learned_width(modules, optimizers, batch, 1, torch.device("cpu"), 0.0)
    assert width.trials[0].memory_bytes > 4 << 20  # its stack's copy, at least
    assert [t.size for t in width.trials] == [1]
    assert width.width == 2 and "would take ~" in width.why and not width.rising


def test_members_trained_in_parts_each_end_on_their_own_runs_weights_shuffled_data_too() -> None:
    shuffled = DataLoader(_loaders()[0].dataset, batch_size=16, shuffle=True)
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    torch.manual_seed(5)  # the stream each member's own run draws its order from
    offers = [
        Offer(read_fit_call(L.Trainer(**QUIET, max_epochs=2), module, shuffled)) for module in fused
    ]
    heard: list[tuple[list[str], Width]] = []
    ends = lead(
        Leading([Joined(f"job{i}", offer, None) for i, offer in enumerate(offers)]),
        fuse_max=99,
        min_gain=9.0,  # no doubling can gain 900 %: two at a time
        on_width=lambda group, width: heard.append((group, width)),
    )
    assert [(group, width.width) for group, width in heard] == [([f"job{i}" for i in range(4)], 2)]
    for index, (lr, wd) in enumerate(CONFIGS):
        end = ends[f"job{index}"]
        assert isinstance(end, Trained) and len(end.group) == 2 and end.in_process == 4
        alone = _member(index, lr, wd)
        torch.manual_seed(5)
        L.Trainer(**QUIET, max_epochs=2).fit(alone, shuffled)
        for name, value in alone.state_dict().items():
            assert torch.equal(end.checkpoint["state_dict"][name], value), (index, name)


def test_a_learning_leader_whose_others_never_came_runs_its_own_fit() -> None:
    train, val = _loaders()
    offer = Offer(read_fit_call(L.Trainer(**QUIET, max_epochs=1), _member(0, 0.1, 0.0), train, val))
    ends = lead(Leading([Joined("job0", offer, None)]), fuse_max=99, min_gain=0.05)
    assert ends == {"job0": Alone("no other config trains like it here")}


def _jobs(tmp_path: Path, count: int) -> collections.deque[Job]:
    return collections.deque(
        Job(str(i), i, (), f"i={i}", JobPaths.of(tmp_path / str(i))) for i in range(count)
    )


def _report(
    job: Job, monkeypatch: pytest.MonkeyPatch, members: int, width: int, rising: bool
) -> None:
    """What the job side's leader leaves for the launcher, through the job side's own writer
    (its group's env as the launcher set it)."""
    for name, value in job.env.items():
        monkeypatch.setenv(name, value)
    group = GroupEnv.from_environ()
    assert group is not None and group.min_gain == 0.05
    measured = Width(width, "vmap", (), "measured", rising)
    group.widths_learned()([f"m{i}" for i in range(members)], measured)


def test_the_launcher_widens_groups_while_every_member_paid_and_narrows_to_a_leaders_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = FusedGroups(seats=64, gather_s=5.0, homes=2, min_gain=0.05)
    queue = _jobs(tmp_path, 200)
    try:
        first = groups.take(queue, free=128, more_may_come=True, running=False)
        assert len(first) == FIRST_WIDTH and groups.seats_open(128) == 2 * FIRST_WIDTH
        assert first[0].env[env_vars.FUSE_MIN_GAIN] == "0.05"
        _report(first[0], monkeypatch, FIRST_WIDTH, FIRST_WIDTH, rising=True)
        second = groups.take(queue, free=112, more_may_come=True, running=True)
        assert len(second) == 2 * FIRST_WIDTH  # the first group's every member paid
        # both slots hold a group: seats are free on them, but no third leader shares a slot
        assert groups.take(queue, free=80, more_may_come=True, running=True) == []
        assert groups.seats_free(80) == 0 and groups.seats_open(128) == 2 * 2 * FIRST_WIDTH
        _report(second[0], monkeypatch, 2 * FIRST_WIDTH, 8, rising=False)
        for job in first:
            groups.ended(job)
        third = groups.take(queue, free=96, more_may_come=True, running=True)
        assert len(third) == 8  # the second group's leader found 8 at a time paid best
        assert third[0].env[env_vars.FUSE_MAX] == "8"
    finally:
        groups.close()


def test_a_set_fuse_max_is_every_groups_width_and_nothing_is_measured(tmp_path: Path) -> None:
    groups = FusedGroups(seats=4, gather_s=5.0, homes=2)
    queue = _jobs(tmp_path, 10)
    try:
        group = groups.take(queue, free=8, more_may_come=True, running=False)
        assert len(group) == 4 and env_vars.FUSE_MIN_GAIN not in group[0].env
        assert groups.seats_open(8) == 8 and groups.seats_free(4) == 4  # the other slot's
    finally:
        groups.close()


@pytest.mark.parametrize(
    ("options", "seats", "min_gain"),
    [
        ({"fuse": "auto"}, LEARNED_SEATS, 0.05),  # fuse_max unset: learned
        ({"fuse": "auto", "fuse_max": "auto", "auto_min_gain": 0.2}, LEARNED_SEATS, 0.2),
        ({"fuse": "auto", "fuse_max": 4}, 4, None),
        ({"fuse": "off"}, 1, None),
    ],
)
def test_fuse_max_unset_or_auto_is_learned_and_a_number_is_the_width(
    options: dict[str, Any], seats: int, min_gain: float | None
) -> None:
    pool = parse_launcher_options(options).pool
    assert (pool.fuse_max, pool.fuse_min_gain) == (seats, min_gain)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_a_gpu_the_width_is_measured_in_cuda_memory_and_stops_where_it_would_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = torch.device("cuda", 0)
    modules, optimizers = _members(8, width=1 << 12)  # their own tensors stay on the CPU
    batch = [t.to(device) for t in sample_batch(_loaders()[0])]
    width = learned_width(modules, optimizers, batch, 1, device, 0.0)
    assert all(t.memory_bytes > 0 for t in width.trials)  # the peak CUDA allocation, each size
    assert 2 <= width.width <= 8 and all(p.device.type == "cpu" for p in modules[0].parameters())
    monkeypatch.setattr(group_width, "MEMORY_SHARE", 1e-9)
    narrow = learned_width(modules, optimizers, batch, 1, device, 0.0)
    assert narrow.width == 2 and "would take ~" in narrow.why
