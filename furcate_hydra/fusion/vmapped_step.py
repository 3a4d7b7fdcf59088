"""A LightningModule hook run for every member at once: ``vmap`` over the stacked tensors.

The hook runs on one module (the first member's), its parameters, buffers and differing
plain numbers (``member_scalars``) swapped for each member's slice of the stack for the
call; what it logs is recorded per member (``step_logs``); a training step's gradients come
back stacked like the parameters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import grad_and_value, vmap
from torch.nn.utils.stateless import _reparametrize_module

from furcate_hydra.fusion.member_scalars import scalars_set
from furcate_hydra.fusion.stack import MemberStack
from furcate_hydra.fusion.step_logs import LogOptions, StepLogs, UnfusableStep, recording_logs

StepFn = Callable[[MemberStack, Any, int], tuple[dict[str, torch.Tensor], StepLogs]]


# how a step runs its members: all at once through vmap, or one after another on one module
# (for layers whose batched form is slower than the loop, as convolutions are on a CPU)
STEP_MODES = ("vmap", "loop")


def vmapped_step(
    base: nn.Module, hook: str, with_grad: bool, divisor: int = 1, mode: str = "vmap"
) -> StepFn:
    """``base.<hook>(batch, batch_idx)`` for every member, through ``vmap`` (``mode="vmap"``)
    or member after member (``"loop"``), either way each member's own values; a training loss
    is divided by ``divisor`` (the batches accumulated), as Lightning divides it."""
    if mode not in STEP_MODES:
        raise ValueError(f"step mode {mode!r}: one of {', '.join(STEP_MODES)}")
    options_seen: dict[str, LogOptions] = {}

    def one_member(
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        scalars: dict[str, torch.Tensor],
        batch: Any,
        batch_idx: int,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logs = StepLogs(in_training=hook == "training_step")
        with (
            _reparametrize_module(base, {**params, **buffers}),
            scalars_set(base, scalars),
            recording_logs(base, logs),
        ):
            output = getattr(base, hook)(batch, batch_idx)
        options_seen.clear()
        options_seen.update(logs.options)
        loss = output["loss"] if isinstance(output, dict) else output
        if with_grad and not isinstance(loss, torch.Tensor):
            raise UnfusableStep(f"its {hook} returned {type(output).__name__}, not a loss")
        if not with_grad:
            return torch.zeros(()), logs.values
        return loss / divisor if divisor > 1 else loss, logs.values

    # the transforms, made once: each call of the step only applies them
    member_grad = grad_and_value(one_member, has_aux=True)
    batched = vmap(member_grad if with_grad else one_member, in_dims=(0, 0, 0, None, None))

    def looped(
        stack: MemberStack, batch: Any, batch_idx: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        grads: list[dict[str, torch.Tensor]] = []
        values: list[dict[str, torch.Tensor]] = []
        for member in range(stack.count):
            params, buffers, scalars = (
                {k: v[member] for k, v in part.items()} for part in stack.parts()
            )
            if with_grad:
                grad, (_, logged) = member_grad(params, buffers, scalars, batch, batch_idx)
                grads.append(grad)
            else:
                with torch.no_grad():
                    _, logged = one_member(params, buffers, scalars, batch, batch_idx)
            values.append(logged)
        return _stacked(grads), _stacked(values)

    def run(
        stack: MemberStack, batch: Any, batch_idx: int
    ) -> tuple[dict[str, torch.Tensor], StepLogs]:
        logs = StepLogs(in_training=hook == "training_step")
        if mode == "loop":
            grads, values = looped(stack, batch, batch_idx)
        elif with_grad:
            grads, (_, values) = batched(*stack.parts(), batch, batch_idx)
        else:
            with torch.no_grad():
                _, values = batched(*stack.parts(), batch, batch_idx)
            grads = {}
        logs.values = {k: v.detach() for k, v in values.items()}
        logs.options = dict(options_seen)
        return grads, logs

    return run


def faster_mode(steps: dict[str, StepFn], stack: MemberStack, batch: Any) -> str:
    """The step mode that runs ``batch`` faster here, timed on its second run (the first
    traces and warms up); the gradients are discarded, nothing is updated."""
    seconds = {}
    for mode, step in steps.items():
        step(stack, batch, 0)
        began = time.perf_counter()
        step(stack, batch, 0)
        seconds[mode] = time.perf_counter() - began
    return min(seconds, key=lambda mode: seconds[mode])


def _stacked(per_member: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not per_member:
        return {}
    return {key: torch.stack([values[key] for values in per_member]) for key in per_member[0]}
