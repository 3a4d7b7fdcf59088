"""One optimizer step over the stacked parameters, each member with its own hyperparameters.

Each member keeps its own torch optimizer (built by its own ``configure_optimizers``), over
parameters it no longer trains: it holds the member's hyperparameters, and its lr scheduler
moves them as it would in the member's own run. Every step reads them afresh and applies
torch's update rule (SGD, Adam, AdamW, single-tensor form) to all members at once, with the
hyperparameters as ``[N, 1, ...]`` tensors. A member that stopped keeps its weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

SUPPORTED = ("SGD", "Adam", "AdamW")
# what the fused step applies per member, read from each member's param group
_HYPERPARAMETERS = {
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay"),
}
# flags that change torch's update rule or its arithmetic: the fused step is torch's
# single-tensor rule with these values only (foreach and fused kernels round otherwise)
_FLAGS: dict[str, tuple[object, ...]] = {
    "amsgrad": (False,),
    "maximize": (False,),
    "capturable": (False,),
    "differentiable": (False,),
    "foreach": (None, False),
    "fused": (None, False),
}
# what lr schedulers keep in a param group for themselves
_SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "base_lr", "base_momentum", "max_momentum")


def optimizer_refusals(optimizers: Sequence[torch.optim.Optimizer]) -> list[str]:
    """Why these members' optimizers cannot step as one (empty: they can)."""
    kinds = {type(opt).__name__ for opt in optimizers}
    if len(kinds) > 1:
        return [f"its optimizer differs ({', '.join(sorted(kinds))})"]
    kind = kinds.pop()
    if kind not in SUPPORTED:
        return [f"its optimizer {kind} has no fused form (fused: {', '.join(SUPPORTED)})"]
    reasons = []
    for opt in optimizers:
        if len(opt.param_groups) != 1:
            reasons.append(f"its optimizer has {len(opt.param_groups)} parameter groups")
            break
        reasons += _group_refusals(kind, opt.param_groups[0])
    if len({optimizer_form(opt) for opt in optimizers}) > 1:
        reasons.append("its optimizer's update rule differs (nesterov or decoupled weight decay)")
    return sorted(set(reasons))


def _group_refusals(kind: str, group: dict[str, object]) -> list[str]:
    """Every key of a param group is either a hyperparameter the fused step applies, a flag
    at a value it implements, or a scheduler's own: anything else is a reason."""
    reasons = []
    for key, value in group.items():
        if key == "params" or key in _HYPERPARAMETERS[kind] or key in _SCHEDULER_KEYS:
            continue
        allowed = _FLAGS.get(key)
        if allowed is None:
            reasons.append(f"its optimizer's {key}={value!r} has no fused form")
        elif value not in allowed:
            reasons.append(f"its optimizer sets {key}={value!r}")
    return reasons


def decoupled_decay(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the weight decay is AdamW's (decoupled), as torch decides it."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    default = type(optimizer).__name__ == "AdamW"
    return bool(group.get("decoupled_weight_decay", default))


def optimizer_form(optimizer: torch.optim.Optimizer) -> str:
    """What members' optimizers must share to step as one: the class and the flags that
    choose its rule (SGD's nesterov, Adam's decoupled weight decay); its hyperparameters may
    differ."""
    kind = type(optimizer).__name__
    if not optimizer.param_groups:
        return kind
    if kind == "SGD":
        return f"SGD(nesterov={bool(optimizer.param_groups[0].get('nesterov', False))})"
    return f"{kind}(decoupled_weight_decay={decoupled_decay(optimizer)})"


# what torch's optimizers hold per parameter, as the fused state's first and second slots
_STATE_KEYS = {
    "SGD": ("momentum_buffer",),
    "Adam": ("exp_avg", "exp_avg_sq"),
    "AdamW": ("exp_avg", "exp_avg_sq"),
}


@dataclass
class _Slot:
    """Per-parameter state of the fused update (momentum buffers, moments)."""

    first: torch.Tensor | None = None
    second: torch.Tensor | None = None


def optimized_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names (in ``module``) of the parameters ``optimizer`` updates, in its group's order."""
    names = {id(param): name for name, param in module.named_parameters()}
    order = [names.get(id(param)) for param in optimizer.param_groups[0]["params"]]
    if None in order:
        raise ValueError("its optimizer updates tensors that are not its module's parameters")
    return [name for name in order if name is not None]


class FusedOptimizer:
    """torch's SGD / Adam / AdamW over ``[N, ...]`` parameters, hyperparameters per member.

    ``names`` are the parameters each member's optimizer updates, in its group's order (the
    same for all: one architecture). The state each member's optimizer already holds (a
    member resumed from its checkpoint) is taken in; ``sync_to_members`` writes each member's
    state back into its own optimizer, where its ``state_dict`` (a checkpoint) finds it in
    torch's own form.
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], names: Sequence[str]) -> None:
        reasons = optimizer_refusals(optimizers)
        if reasons:
            raise ValueError("; ".join(reasons))
        self.members = list(optimizers)
        self.names = list(names)
        self.kind = type(optimizers[0]).__name__
        self.steps = torch.zeros(len(optimizers), dtype=torch.float64)
        self._state: dict[str, _Slot] = {}
        for opt in optimizers:
            # the member's scheduler steps this optimizer without it ever stepping: say it did,
            # as the member's own run would have, so torch does not warn of the order
            opt._opt_called = True  # type: ignore[attr-defined]
        self._take_in_member_state()

    # -- torch's own form of each member's state ----------------------------------------------

    def _take_in_member_state(self) -> None:
        for member, opt in enumerate(self.members):
            for name, param in zip(self.names, opt.param_groups[0]["params"], strict=True):
                held = opt.state.get(param)
                if not held:
                    continue
                if "step" in held:
                    self.steps[member] = float(held["step"])
                slot = self._state.setdefault(name, _Slot())
                for attribute, key in zip(
                    ("first", "second"), _STATE_KEYS[self.kind], strict=False
                ):
                    if held.get(key) is None:
                        continue
                    stacked = getattr(slot, attribute)
                    if stacked is None:
                        shape = (len(self.members), *held[key].shape)
                        stacked = torch.zeros(shape, dtype=held[key].dtype)
                        setattr(slot, attribute, stacked)
                    stacked[member] = held[key]
        # torch counts no steps for SGD: any buffer held is past its first
        if self.kind == "SGD" and self._state:
            self.steps[:] = torch.maximum(self.steps, torch.ones_like(self.steps))

    def to(self, device: torch.device) -> FusedOptimizer:
        """The state on ``device`` (where the stacked parameters are)."""
        for slot in self._state.values():
            slot.first = None if slot.first is None else slot.first.to(device)
            slot.second = None if slot.second is None else slot.second.to(device)
        return self

    @torch.no_grad()
    def sync_to_members(self) -> None:
        """Write each member's state into its own optimizer, as torch would hold it."""
        for member, opt in enumerate(self.members):
            if self.steps[member] == 0:
                continue
            for name, param in zip(self.names, opt.param_groups[0]["params"], strict=True):
                slot = self._state.get(name)
                if slot is None or slot.first is None:
                    continue
                if self.kind == "SGD":
                    momentum = float(opt.param_groups[0]["momentum"])
                    buffer = slot.first[member].detach().cpu().clone() if momentum else None
                    opt.state[param] = {"momentum_buffer": buffer}
                    continue
                assert slot.second is not None
                opt.state[param] = {
                    "step": torch.tensor(float(self.steps[member]), dtype=torch.float32),
                    "exp_avg": slot.first[member].detach().cpu().clone(),
                    "exp_avg_sq": slot.second[member].detach().cpu().clone(),
                }

    def _hyper(self, key: str) -> torch.Tensor:
        return torch.tensor(
            [float(opt.param_groups[0][key]) for opt in self.members], dtype=torch.float64
        )

    @torch.no_grad()
    def step(
        self,
        params: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        active: torch.Tensor,
    ) -> None:
        """Update ``params`` in place from ``grads`` for the members where ``active`` holds."""
        self.steps += active.to(torch.float64).cpu()
        nesterov = self.kind == "SGD" and bool(self.members[0].param_groups[0]["nesterov"])
        decoupled = self.kind != "SGD" and decoupled_decay(self.members[0])
        # every scalar is computed in float64 first, as torch computes a Python float, then
        # moved once a step to where the parameters are
        hyper = _Hyper(self._sgd_scalars() if self.kind == "SGD" else self._adam_scalars())
        mask_of = _Hyper({"active": active.to(torch.float64)})
        for name in self.names:
            param = params[name]
            grad = grads.get(name)
            if grad is None:
                continue
            slot = self._state.setdefault(name, _Slot())
            mask = mask_of("active", param) != 0
            if self.kind == "SGD":
                new = self._sgd(param, grad, slot, hyper, nesterov, mask)
            else:
                new = self._adam(param, grad, slot, hyper, decoupled, mask)
            param.copy_(torch.where(mask, new, param))

    def _sgd_scalars(self) -> dict[str, torch.Tensor]:
        return {
            "neg_lr": -self._hyper("lr"),
            "weight_decay": self._hyper("weight_decay"),
            "momentum": self._hyper("momentum"),
            "undamped": 1 - self._hyper("dampening"),
        }

    def _adam_scalars(self) -> dict[str, torch.Tensor]:
        lr, decay = self._hyper("lr"), self._hyper("weight_decay")
        betas = [opt.param_groups[0]["betas"] for opt in self.members]
        beta1 = torch.tensor([float(b[0]) for b in betas], dtype=torch.float64)
        beta2 = torch.tensor([float(b[1]) for b in betas], dtype=torch.float64)
        steps = self.steps.clamp(min=1)
        return {
            "weight_decay": decay,
            "decay_factor": 1 - lr * decay,
            "one_minus_beta1": 1 - beta1,
            "beta2": beta2,
            "one_minus_beta2": 1 - beta2,
            "neg_step_size": -(lr / (1 - beta1**steps)),
            "correction2_sqrt": (1 - beta2**steps) ** 0.5,
            "eps": self._hyper("eps"),
        }

    def _sgd(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slot: _Slot,
        h: _Hyper,
        nesterov: bool,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        # torch's in-place ``a + s * b`` is ``addcmul`` here (``a + s * b / c``: ``addcdiv``),
        # which rounds as that kernel does: each member's update is its own optimizer's, bitwise
        momentum = h("momentum", param)
        grad = torch.addcmul(grad, param, h("weight_decay", param))
        if slot.first is None:
            buffer = grad.clone()
        else:
            buffer = torch.addcmul(slot.first * momentum, grad, h("undamped", param))
        slot.first = torch.where(mask, buffer, slot.first if slot.first is not None else buffer)
        moved = torch.addcmul(grad, buffer, momentum) if nesterov else buffer
        direction = torch.where(momentum != 0, moved, grad)
        return torch.addcmul(param, direction, h("neg_lr", param))

    def _adam(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slot: _Slot,
        h: _Hyper,
        decoupled: bool,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        if decoupled:
            param = param * h("decay_factor", param)
        else:
            grad = torch.addcmul(grad, param, h("weight_decay", param))
        if slot.first is None or slot.second is None:
            slot.first = torch.zeros_like(param)
            slot.second = torch.zeros_like(param)
        first = slot.first.lerp(grad, h("one_minus_beta1", param))
        second = slot.second * h("beta2", param)
        second.addcmul_(grad * h("one_minus_beta2", param), grad)
        # a member that stopped keeps its moments as they were: its checkpoint holds them
        slot.first = torch.where(mask, first, slot.first)
        slot.second = torch.where(mask, second, slot.second)
        denom = (second.sqrt() / h("correction2_sqrt", param)).add_(h("eps", param))
        return torch.addcdiv(param, first * h("neg_step_size", param), denom)


class _Hyper:
    """One step's per-member scalars (float64 ``[N]``), each moved to a parameter's device and
    dtype once, then shaped ``[N, 1, ...]`` to broadcast against it."""

    def __init__(self, values: dict[str, torch.Tensor]) -> None:
        self.values = values
        self._moved: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}

    def __call__(self, key: str, like: torch.Tensor) -> torch.Tensor:
        moved = self._moved.get((key, like.device, like.dtype))
        if moved is None:
            moved = self.values[key].to(device=like.device, dtype=like.dtype)
            self._moved[(key, like.device, like.dtype)] = moved
        return moved.view((moved.shape[0],) + (1,) * (like.dim() - 1))
