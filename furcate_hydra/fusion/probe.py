"""One vmapped step on a first batch, before a member joins a group: what only running shows.

A stateful metric updated inside a step, Python control flow on a tensor's value, a step that
returns no loss, or one that reads of its Trainer more than where training is
(``trainer_view``) cannot run once for all members. The probe runs ``training_step`` (and
``validation_step``) of the member's own module over a copy of its tensors, so the member's
module, its metrics and the random streams are left as they were. It also notes what the
steps read of the module (``step_reads``), and whether the floats they read can be each
member's own as tensors, bitwise: the step run with the floats and with them as tensors must
give the same loss, gradients and logged values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from furcate_hydra.errors import first_line
from furcate_hydra.fusion.lineage import defines
from furcate_hydra.fusion.member_scalars import float_names
from furcate_hydra.fusion.random_states import StreamsKept
from furcate_hydra.fusion.refusals import is_stateful_metric
from furcate_hydra.fusion.stack import MemberStack
from furcate_hydra.fusion.step_logs import UnfusableStep
from furcate_hydra.fusion.step_reads import is_read, reads_recorded
from furcate_hydra.fusion.trainer_view import TrainerView, attached
from furcate_hydra.fusion.vmapped_step import vmapped_step

# what torch.func says when a step reads a value that differs per member
_DATA_DEPENDENT = ("data-dependent control flow", ".item()", "data-dependent")


@dataclass
class Probe:
    """What running a member's steps showed."""

    reasons: list[str] = field(default_factory=list)  # why they cannot run vmapped
    reads: set[str] = field(default_factory=set)  # what they read of the module (step_reads)
    exact_floats: set[str] = field(default_factory=set)  # floats read, each member's own


def probe_steps(module: nn.Module, train_batch: Any, val_batch: Any | None) -> Probe:
    """Run ``module``'s steps vmapped on one batch each (none where ``train_batch`` is None:
    nothing to probe with); every random stream is as before after."""
    probe = Probe()
    if train_batch is None:
        return probe
    hooks: list[tuple[str, Any]] = [("training_step", train_batch)]
    if val_batch is not None and defines(module, "validation_step"):
        hooks.append(("validation_step", val_batch))
    was_training = module.training
    stack = MemberStack([module])  # made before reads are recorded: it reads every value
    with StreamsKept(), attached(module, TrainerView()):
        with reads_recorded(module) as reads:
            for hook, batch in hooks:
                module.train(hook == "training_step")
                probe.reasons += _refusal(module, hook, batch, stack)
        probe.reads = set(reads)
        floats = [name for name in float_names(module) if is_read(name, probe.reads)]
        if floats and not probe.reasons:
            if _floats_exact(module, hooks, floats):
                probe.exact_floats = set(floats)
            else:  # one at a time: a float the step takes as a Python number stays equal
                probe.exact_floats = {f for f in floats if _floats_exact(module, hooks, [f])}
    module.train(was_training)
    return probe


def step_refusals(module: nn.Module, train_batch: Any, val_batch: Any | None) -> list[str]:
    """Why ``module``'s steps cannot run vmapped (empty: they can)."""
    return probe_steps(module, train_batch, val_batch).reasons


def _refusal(module: nn.Module, hook: str, batch: Any, stack: MemberStack) -> list[str]:
    try:
        with _metrics_refused(module, hook):
            vmapped_step(module, hook, with_grad=hook == "training_step")(stack, batch, 0)
    except UnfusableStep as refusal:
        return [str(refusal)]
    except Exception as error:  # any failure under vmap is a reason to run alone
        message = first_line(error)
        if any(marker in message for marker in _DATA_DEPENDENT):
            return [f"its {hook} branches on a tensor's value"]
        return [f"its {hook} fails under vmap ({type(error).__name__}: {message})"]
    return []


def _floats_exact(module: nn.Module, hooks: list[tuple[str, Any]], floats: list[str]) -> bool:
    """Whether each step gives, bitwise, the same loss, gradients and logged values with the
    module's ``floats`` as they are and as 0-d tensors (how a group sets them per member)."""
    for hook, batch in hooks:
        module.train(hook == "training_step")
        step = vmapped_step(module, hook, with_grad=hook == "training_step")
        stacks = MemberStack([module]), MemberStack([module], scalar_names=floats)
        try:
            with torch.random.fork_rng(devices=[]):
                plain = step(stacks[0], batch, 0)
            with torch.random.fork_rng(devices=[]):
                tensors = step(stacks[1], batch, 0)
        except Exception:  # a float the step cannot take as a tensor
            return False
        for mine, theirs in ((plain[0], tensors[0]), (plain[1].values, tensors[1].values)):
            if mine.keys() != theirs.keys():
                return False
            if not all(torch.equal(mine[key], theirs[key]) for key in mine):
                return False
    return True


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
