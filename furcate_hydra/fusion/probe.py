"""One vmapped step on a first batch, before a member joins a group: what only running shows.

A stateful metric updated inside a step, Python control flow on a tensor's value, or a step
that returns no loss cannot run once for all members. The probe runs ``training_step`` (and
``validation_step``) of the member's own module over a copy of its tensors, so the member's
module, its metrics and the random stream are left as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

from furcate_hydra.errors import first_line
from furcate_hydra.fusion.lineage import defines
from furcate_hydra.fusion.refusals import is_stateful_metric
from furcate_hydra.fusion.stack import MemberStack
from furcate_hydra.fusion.step_logs import UnfusableStep
from furcate_hydra.fusion.vmapped_step import vmapped_step

# what torch.func says when a step reads a value that differs per member
_DATA_DEPENDENT = ("data-dependent control flow", ".item()", "data-dependent")


def step_refusals(module: nn.Module, train_batch: Any, val_batch: Any | None) -> list[str]:
    """Why ``module``'s steps cannot run vmapped (empty: they can), from one batch each
    (none where ``train_batch`` is None: nothing to probe with)."""
    if train_batch is None:
        return []
    stack = MemberStack([module])
    hooks: list[tuple[str, Any]] = [("training_step", train_batch)]
    if val_batch is not None and defines(module, "validation_step"):
        hooks.append(("validation_step", val_batch))
    reasons = []
    was_training = module.training
    for hook, batch in hooks:
        module.train(hook == "training_step")
        try:
            with _metrics_refused(module, hook):
                vmapped_step(module, hook, with_grad=hook == "training_step")(stack, batch, 0)
        except UnfusableStep as refusal:
            reasons.append(str(refusal))
        except Exception as error:  # any failure under vmap is a reason to run alone
            message = first_line(error)
            if any(marker in message for marker in _DATA_DEPENDENT):
                reasons.append(f"its {hook} branches on a tensor's value")
            else:
                reasons.append(f"its {hook} fails under vmap ({type(error).__name__}: {message})")
    module.train(was_training)
    return reasons


@contextmanager
def _metrics_refused(module: nn.Module, hook: str) -> Iterator[None]:
    """While the block runs, a stateful metric's update raises the reason to run alone."""
    with ExitStack() as undo:
        for _, child in module.named_modules():
            if not is_stateful_metric(child):
                continue
            reason = f"{type(child).__name__} updated inside {hook}"
            for name in ("forward", "update"):
                setattr(child, name, _refuser(reason))
                undo.callback(_forget, child, name)
        yield


def _refuser(reason: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnfusableStep(reason)

    return refuse


def _forget(module: nn.Module, name: str) -> None:
    if name in vars(module):
        delattr(module, name)
