"""How many members of a group train at once when ``fuse_max`` is left unset: the widest
group whose step still pays per member and still fits the memory free.

    sizes 1, 2, 4, ... up to the members there are, each with the first members:
        one fused step (forward, backward, the fused optimizer's update) on a sample batch,
        timed (best of a few), in the faster step mode; the memory it took measured
        (CUDA: peak allocated; CPU: the process's peak resident size)
    doubling stops where a member's share of a step falls by less than ``min_gain``, where
    the next size would not fit the memory free, or where one step already takes seconds
    (a group that slow is not held back by its per-step overhead, which fusion saves)

Nothing here touches a member: the steps run on copies of the first members' tensors with
a fused optimizer of their own, and the random streams are put back as they were.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from furcate_hydra.fusion.host_memory import (
    available_bytes,
    peak_resident_bytes,
    resident_bytes,
    restart_peak,
)
from furcate_hydra.fusion.optimizer import FusedOptimizer, optimized_names
from furcate_hydra.fusion.stack import MemberStack
from furcate_hydra.fusion.vmapped_step import STEP_MODES, StepFn, vmapped_step

# each size's step is timed this many times after a first, untimed one (which traces and
# warms up); the fastest counts, as the least disturbed by anything else on the machine
REPEATS = 3
# a step that takes this long at some size has no per-step overhead left worth fusing away
SLOW_STEP_S = 1.0
# the share of the memory free at the start that the widest group may take
MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class SizeTrial:
    """One size's fused step: its fastest time, the memory it took, the mode that gave it."""

    size: int
    seconds: float
    memory_bytes: int  # beyond what the process held before it; 0: not measured
    mode: str

    @property
    def per_member_s(self) -> float:
        return self.seconds / self.size


@dataclass(frozen=True)
class Width:
    """How many members train at once, and what was measured to decide it."""

    width: int
    mode: str  # the step mode measured fastest at that width
    trials: tuple[SizeTrial, ...]
    why: str  # one line: what stopped the doubling
    rising: bool  # a member's share still fell at the widest size tried (all members)

    def describe(self, members: int) -> str:
        """One line for the sweep's log: the decision and the per-member step times."""
        shares = ", ".join(f"{t.per_member_s * 1e3:.3g} ms at {t.size}" for t in self.trials)
        return (
            f"{members} member(s) train {self.width} at a time ({self.why}; a member's share "
            f"of a step: {shares})"
        )


def choose_width(
    trials: Sequence[SizeTrial], members: int, min_gain: float, memory_free: int | None
) -> tuple[int, str, bool] | None:
    """The width the trials so far give, with why and whether it was still rising, or None:
    try the next size (double the last, at most ``members``)."""
    last = trials[-1]
    if len(trials) >= 2:
        before = trials[-2]
        if last.per_member_s > before.per_member_s * (1 - min_gain):
            gain = 1 - last.per_member_s / before.per_member_s
            moved = f"fell {gain:.0%}" if gain >= 0 else f"rose {-gain:.0%}"
            why = (
                f"from {before.size} to {last.size} a member's share of a step {moved}, "
                f"less than the {min_gain:.0%} asked"
            )
            return max(before.size, 2), why, False
    if last.size >= members:
        return members, "every member fits and each doubling paid", True
    if last.seconds >= SLOW_STEP_S:
        why = f"a step of {last.size} takes {last.seconds:.2g} s: no overhead left to save"
        return max(last.size, 2), why, False
    following = min(2 * last.size, members)
    if memory_free is not None and last.memory_bytes * following / last.size > memory_free:
        need = last.memory_bytes * following / last.size / 2**20
        free = memory_free / 2**20
        why = f"{following} would take ~{need:.0f} MiB, more than the {free:.0f} MiB free"
        return max(last.size, 2), why, False
    return None


@dataclass(frozen=True)
class _Sample:
    """What each size's step runs on: a batch (on the device), Lightning's accumulation
    divisor of the loss, the device."""

    batch: Any
    divisor: int
    device: torch.device


def learned_width(
    modules: Sequence[torch.nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    batch: Any,
    divisor: int,
    device: torch.device,
    min_gain: float,
) -> Width:
    """Time the group's fused step at doubling sizes on ``batch`` (on ``device`` already)
    and choose how many of the ``len(modules)`` members train at once (2 at the least)."""
    members = len(modules)
    sample = _Sample(batch, divisor, device)
    memory_free = _memory_free(device)
    trials: list[SizeTrial] = []
    chosen: tuple[int, str, bool] | None = None
    size = 1
    with _streams_kept(device):
        while True:
            try:
                trials.append(_trial(modules[:size], optimizers[:size], sample))
            except torch.cuda.OutOfMemoryError:
                if not trials:
                    raise  # not even one member's step fits: its own fit would say so too
                torch.cuda.empty_cache()
                last = trials[-1].size
                chosen = max(last, 2), f"{size} ran out of the GPU's memory", False
                break
            chosen = choose_width(trials, members, min_gain, memory_free)
            if chosen is not None:
                break
            size = min(2 * size, members)
    assert chosen is not None
    width, why, rising = chosen
    at = [t for t in trials if t.size <= width]
    return Width(width, (at or trials)[-1].mode, tuple(trials), why, rising)


def _trial(
    modules: Sequence[torch.nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    sample: _Sample,
) -> SizeTrial:
    device = sample.device
    held = _memory_held(device)
    measured = _reset_peak(device)
    stack = MemberStack(modules, device)
    base = copy.deepcopy(modules[0]).to(device)
    names = optimized_names(modules[0], optimizers[0])
    # a copy of each optimizer: the fused one marks and reads what it is given
    fused = FusedOptimizer([copy.deepcopy(o) for o in optimizers], names).to(device)
    active = torch.ones(len(modules), dtype=torch.bool)
    best: dict[str, float] = {}
    for mode in STEP_MODES:
        step = vmapped_step(base, "training_step", True, sample.divisor, mode)
        best[mode] = min(_timed(step, stack, fused, active, sample) for _ in range(REPEATS + 1))
    mode = min(best, key=lambda m: best[m])
    taken = max(_memory_peak(device) - held, 0) if measured else 0
    return SizeTrial(len(modules), best[mode], taken, mode)


def _timed(
    step: StepFn, stack: MemberStack, fused: FusedOptimizer, active: torch.Tensor, sample: _Sample
) -> float:
    _sync(sample.device)
    began = time.perf_counter()
    grads, _ = step(stack, sample.batch, 0)
    fused.step(stack.params, grads, active)
    _sync(sample.device)
    return time.perf_counter() - began


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _streams_kept(device: torch.device) -> Iterator[None]:
    """A step may draw random numbers (dropout): the members' streams must not move."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


# -- memory: CUDA's allocator on a GPU, the process's resident size on a CPU -----------------


def _memory_free(device: torch.device) -> int | None:
    """What the widest group may take: a share of what is free now (None: unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * MEMORY_SHARE)
    available = available_bytes()  # the host's, or less where a memory cgroup bounds it
    return None if available is None else int(available * MEMORY_SHARE)


def _memory_held(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return resident_bytes()


def _reset_peak(device: torch.device) -> bool:
    """Start the peak again from now; False: it cannot be here (the memory goes unmeasured)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    return restart_peak()


def _memory_peak(device: torch.device) -> int:
    """The peak since ``_reset_peak`` (0: not measured here)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_resident_bytes()
