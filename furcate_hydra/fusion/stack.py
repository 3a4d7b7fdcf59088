"""The members' parameters and buffers, stacked along a leading member axis."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from furcate_hydra.fusion.member_scalars import differing_scalars


class MemberStack:
    """Each parameter and buffer of N same-shaped modules as one ``[N, ...]`` tensor, and
    each plain float that differs between them (or each of ``scalar_names``) as one ``[N]``
    tensor (``scalars``).

    The parameters are leaves that the fused optimizer updates in place; ``member_state``
    gives one member's tensors back under the module's own names.
    """

    def __init__(
        self,
        modules: Sequence[nn.Module],
        device: torch.device | None = None,
        scalar_names: Sequence[str] | None = None,
    ) -> None:
        if not modules:
            raise ValueError("a fused group needs at least one member")
        self.count = len(modules)
        first = modules[0]
        self.param_names = [name for name, _ in first.named_parameters()]
        self.buffer_names = [name for name, _ in first.named_buffers()]
        self.params: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        each_params = [dict(m.named_parameters()) for m in modules]
        each_buffers = [dict(m.named_buffers()) for m in modules]
        for name in self.param_names:
            stacked = torch.stack([own[name].detach() for own in each_params])
            self.params[name] = stacked.to(device).clone()
        for name in self.buffer_names:
            stacked = torch.stack([own[name].detach() for own in each_buffers])
            self.buffers[name] = stacked.to(device).clone()
        dtype = next(iter(self.params.values())).dtype if self.params else torch.float32
        scalars = differing_scalars(modules, dtype, scalar_names)
        self.scalars = {name: values.to(device) for name, values in scalars.items()}

    def parts(
        self,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """What a step takes, in its order: parameters, buffers, the differing scalars."""
        return self.params, self.buffers, self.scalars

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s parameters and buffers, on the CPU, by the module's names."""
        state = {name: t[member].detach().cpu().clone() for name, t in self.params.items()}
        state.update({name: t[member].detach().cpu().clone() for name, t in self.buffers.items()})
        return state

    def load_into(self, member: int, module: nn.Module) -> None:
        """Copy member ``member``'s trained tensors into its own module (same names, shapes)."""
        state = self.member_state(member)
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(state[name])
            for name, buffer in module.named_buffers():
                buffer.copy_(state[name])
