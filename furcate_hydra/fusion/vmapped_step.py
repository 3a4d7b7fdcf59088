"""A LightningModule hook run for every member at once: ``vmap`` over the stacked tensors.

The hook runs on one module (the first member's), its parameters, buffers and differing
plain numbers (``member_scalars``) swapped for each member's slice of the stack for the
call; what it logs is recorded per member (``step_logs``); a training step's gradients come
back stacked like the parameters.
"""

from __future__ import annotations

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


def vmapped_step(base: nn.Module, hook: str, with_grad: bool, divisor: int = 1) -> StepFn:
    """``base.<hook>(batch, batch_idx)`` for every member at once, through ``vmap``; a
    training loss is divided by ``divisor`` (the batches accumulated), as Lightning divides it."""
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

    def run(
        stack: MemberStack, batch: Any, batch_idx: int
    ) -> tuple[dict[str, torch.Tensor], StepLogs]:
        logs = StepLogs(in_training=hook == "training_step")
        if with_grad:
            fn = vmap(grad_and_value(one_member, has_aux=True), in_dims=(0, 0, 0, None, None))
            grads, (_, values) = fn(stack.params, stack.buffers, stack.scalars, batch, batch_idx)
        else:
            with torch.no_grad():
                _, values = vmap(one_member, in_dims=(0, 0, 0, None, None))(
                    stack.params, stack.buffers, stack.scalars, batch, batch_idx
                )
            grads = {}
        logs.values = {k: v.detach() for k, v in values.items()}
        logs.options = dict(options_seen)
        return grads, logs

    return run
