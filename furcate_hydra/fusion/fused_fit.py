"""The loop Lightning's ``fit`` runs (automatic optimization), for all members at once.

One vmapped ``training_step`` gives every member's loss, gradients and logged values; the
fused optimizer steps every member that still trains. The order is Lightning's, because a
member must train as its own run would: gradients accumulated over ``accumulate_grad_batches``
(the loss divided by it), clipped per member, the optimizer step, step-interval schedulers;
at the epoch's last batch the epoch-interval schedulers, then validation; plateau schedulers
after it. What each member logged goes to the ``FusionObserver``, which may stop members.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from furcate_hydra.fusion.epoch_means import EpochMeans
from furcate_hydra.fusion.member_progress import MemberProgress
from furcate_hydra.fusion.member_streams import MemberStreams
from furcate_hydra.fusion.optimizer import FusedOptimizer, optimized_names
from furcate_hydra.fusion.sample_batch import sample_batch
from furcate_hydra.fusion.settings import TrainingShape
from furcate_hydra.fusion.stack import MemberStack
from furcate_hydra.fusion.step_logs import LogOptions, StepLogs
from furcate_hydra.fusion.trainer_view import TrainerView, attached
from furcate_hydra.fusion.vmapped_step import STEP_MODES, StepFn, faster_mode, vmapped_step


class FusedFitStopped(Exception):
    """The fit was asked to stop (its process was preempted) before it ended."""


@dataclass
class SchedulerPlan:
    """One member's lr scheduler as Lightning configured it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None

    @property
    def on_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


@dataclass
class MemberTraining:
    """One member: its module (untouched until the end), optimizer and schedulers, and the
    random states its own run's training starts from (None: the live ones)."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    schedulers: list[SchedulerPlan] = field(default_factory=list)
    streams: dict[str, Any] | None = None


class FusionObserver(Protocol):
    """What a fused fit reports, each value a ``[N]`` tensor (one per member)."""

    def train_step(
        self, step: int, epoch: int, logs: dict[str, torch.Tensor], options: dict[str, LogOptions]
    ) -> None:
        """After a training batch: its on_step values; ``step`` counts optimizer steps."""

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        """After validation: its epoch means; returns the members that stop now (bool ``[N]``)."""
        ...

    def train_epoch_end(
        self, step: int, epoch: int, means: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """After a training epoch: the means of what was logged on_epoch in training; returns
        the members that stop now (bool ``[N]``), or None: none."""


@dataclass
class FusedOutcome:
    """Where each member ended, counted as Lightning counts, and how the steps ran."""

    progress: list[MemberProgress]
    step_mode: str  # vmap or loop
    streams: list[dict[str, Any]] = field(default_factory=list)  # each member's, at its end

    @property
    def epochs(self) -> list[int]:
        return [p.epochs for p in self.progress]

    @property
    def steps(self) -> list[int]:
        return [p.steps for p in self.progress]


def fused_fit(
    members: Sequence[MemberTraining],
    shape: TrainingShape,
    train_loader: Iterable[Any],
    val_loader: Iterable[Any] | None,
    observer: FusionObserver,
    device: torch.device | None = None,
    start: Sequence[MemberProgress] | None = None,
    step_mode: str = "auto",
    on_epoch: Callable[[torch.Tensor, list[MemberProgress], list[dict[str, Any]]], None]
    | None = None,
    stop_asked: Callable[[], bool] | None = None,
    drawn_streams: Sequence[str] = (),
) -> FusedOutcome:
    """Train every member on the same batches; their modules hold the trained weights after,
    their optimizers their state. ``start``: where the members resume (the same epoch and
    step for all), their modules, optimizers and schedulers restored from their checkpoints.
    ``step_mode``: ``vmap``, ``loop`` (see ``vmapped_step``), or ``auto``: the faster of the
    two on the first batch. ``on_epoch(trained, progress, streams)``: after each epoch, with
    the members that trained in it (bool ``[N]``), where each is, their modules, optimizers
    and schedulers at its end, and each one's random states then. Steps read the group's
    epoch and optimizer steps as ``self.current_epoch`` and ``self.global_step``.
    ``stop_asked()``: asked before each batch; True raises ``FusedFitStopped`` (a preemption:
    the members resume from their last epoch's end). ``drawn_streams``: the global streams
    besides torch's that the data draws from (``MemberStreams``)."""
    device = device or torch.device("cpu")
    stack = MemberStack([m.module for m in members], device)
    # the members' own modules stay where the app made them (their ends are sent from there);
    # on another device the step runs on a copy of the first
    first = members[0].module
    base = first if device.type == "cpu" else copy.deepcopy(first).to(device)
    names = optimized_names(members[0].module, members[0].optimizer)
    optimizer = FusedOptimizer([m.optimizer for m in members], names).to(device)
    count = len(members)
    active = torch.ones(count, dtype=torch.bool)
    progress = [replace(p) for p in start] if start else [MemberProgress() for _ in members]
    divisor = shape.accumulate_grad_batches
    modes = STEP_MODES if step_mode == "auto" else (step_mode,)
    steps = {mode: vmapped_step(base, "training_step", True, divisor, mode) for mode in modes}
    sample = sample_batch(train_loader) if step_mode == "auto" else None
    if step_mode == "auto":
        step_mode = (
            "vmap" if sample is None else faster_mode(steps, stack, to_device(sample, device))
        )
    train_step = steps[step_mode]
    val_step = (
        vmapped_step(base, "validation_step", False, mode=step_mode)
        if val_loader is not None
        else None
    )
    epoch, step = progress[0].epochs, progress[0].steps
    train_batches = shape.batches(len(train_loader), shape.limit_train_batches)  # type: ignore[arg-type]
    streams = MemberStreams([m.streams for m in members], [train_loader, val_loader], drawn_streams)
    view = TrainerView()
    stopping = torch.zeros(count, dtype=torch.bool)  # asked to stop, until min_* allow it
    latest_val: dict[str, torch.Tensor] = {}  # the last validation's means, as Lightning keeps
    total = progress[0].batches  # batches trained across epochs (Lightning's total_batch_idx)
    base.train()
    with attached(base, view):
        while (shape.max_epochs < 0 or epoch < shape.max_epochs) and _below(step, shape.max_steps):
            view.current_epoch = epoch
            means = EpochMeans()
            training = active.clone()  # the members this epoch counts for, stopped in it or not
            for i in _members(active):
                progress[i].epoch_started()
            grads: dict[str, torch.Tensor] | None = None
            for batch_idx, batch in _counted(streams.iterate(train_loader), train_batches):
                if stop_asked is not None and stop_asked():
                    raise FusedFitStopped(f"stopped in epoch {epoch}, batch {batch_idx}")
                batch = to_device(batch, device)
                view.global_step = step
                grads_now, logs = train_step(stack, batch, batch_idx)
                grads = (
                    grads_now if grads is None else {k: grads[k] + g for k, g in grads_now.items()}
                )
                last = batch_idx + 1 == train_batches
                stepped = (batch_idx + 1) % shape.accumulate_grad_batches == 0 or last
                for i in _members(active):
                    progress[i].batch_done(stepped)
                if stepped:
                    _clip(grads, shape)
                    optimizer.step(stack.params, grads, active)
                    grads = None
                    step += 1
                    _step_schedulers(
                        members, active, progress, "step", batch_idx + 1, plateau=False
                    )
                if last:
                    _step_schedulers(members, active, progress, "epoch", epoch + 1, plateau=False)
                means.add(logs.values, logs.options, _batch_size(batch))
                observer.train_step(step, epoch, _on_step(logs), logs.options)
                validates = _validates(shape, epoch, batch_idx, total, train_batches)
                if val_step is not None and val_loader is not None and validates:
                    view.global_step = step
                    val_means, val_batches = _validate(
                        val_step, stack, streams, val_loader, shape, device, base
                    )
                    latest_val = val_means
                    for i in _members(active):
                        progress[i].validated(val_batches)
                    stopping |= observer.validation_end(step, epoch, val_means).to(torch.bool)
                    _step_schedulers(
                        members,
                        active,
                        progress,
                        "step",
                        batch_idx + 1,
                        plateau=True,
                        metrics=val_means,
                    )
                total += 1
                # Lightning stops within an epoch once min_epochs and min_steps allow it
                if shape.may_stop(epoch, step):
                    active &= ~stopping
                if not _below(step, shape.max_steps) or not bool(active.any()):
                    break
            ended = observer.train_epoch_end(step, epoch, means.result())
            if ended is not None:
                stopping |= ended.to(torch.bool)
            for i in _members(training):
                progress[i].epochs += 1
            _step_schedulers(
                members,
                active,
                progress,
                "epoch",
                epoch + 1,
                plateau=True,
                metrics={**latest_val, **means.latest},
            )
            epoch += 1
            if shape.may_stop(epoch, step):
                active &= ~stopping
            if on_epoch is not None:  # the members' own objects hold the epoch's end now
                for i in _members(training):
                    stack.load_into(i, members[i].module)
                optimizer.sync_to_members()
                on_epoch(training, progress, [streams.state_of(i) for i in range(count)])
            if not bool(active.any()):
                break
    for i, member in enumerate(members):
        stack.load_into(i, member.module)
    optimizer.sync_to_members()
    return FusedOutcome(
        progress=progress,
        step_mode=step_mode,
        streams=[streams.state_of(i) for i in range(count)],
    )


def _counted(iterator: Iterator[Any], count: int) -> Iterator[tuple[int, Any]]:
    """The first ``count`` batches of ``iterator``, numbered, and no call after them: Lightning
    stops at a loader's length, so a sampler's draws at its end (torch's ``RandomSampler``
    draws one more order from its generator there) never happen."""
    for index in range(count):
        try:
            batch = next(iterator)
        except StopIteration:
            return
        yield index, batch


def _members(mask: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.nonzero(mask).flatten()]


def _below(step: int, max_steps: int) -> bool:
    return max_steps < 0 or step < max_steps


def _validates(
    shape: TrainingShape, epoch: int, batch_idx: int, total: int, train_batches: int
) -> bool:
    """Lightning's rule: every ``check_val_every_n_epoch`` epochs, at the batches
    ``val_check_interval`` names: counted within the epoch, or across epochs where
    ``check_val_every_n_epoch`` is None."""
    every = shape.check_val_every_n_epoch
    if every is not None and (epoch + 1) % every != 0:
        return False
    interval = shape.val_check_interval
    check_batch = interval if isinstance(interval, int) else int(train_batches * interval)
    current = total if every is None else batch_idx
    return check_batch > 0 and (current + 1) % check_batch == 0


def _validate(
    val_step: StepFn,
    stack: MemberStack,
    streams: MemberStreams,
    loader: Iterable[Any],
    shape: TrainingShape,
    device: torch.device,
    base: nn.Module,
) -> tuple[dict[str, torch.Tensor], int]:
    """Every member's validation means, and the batches the run took."""
    base.eval()
    means = EpochMeans()
    batches = shape.batches(len(loader), shape.limit_val_batches)  # type: ignore[arg-type]
    done = 0
    for batch_idx, batch in _counted(streams.iterate(loader), batches):
        batch = to_device(batch, device)
        _, logs = val_step(stack, batch, batch_idx)
        means.add(logs.values, logs.options, _batch_size(batch))
        done += 1
    base.train()
    return means.result(), done


def _clip(grads: dict[str, torch.Tensor], shape: TrainingShape) -> None:
    """Lightning's gradient clipping (torch's clip_grad_norm_ / clip_grad_value_), per member."""
    limit = shape.gradient_clip_val
    if limit is None:
        return
    if shape.gradient_clip_algorithm == "value":
        for g in grads.values():
            g.clamp_(-limit, limit)
        return
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], dim=1)
    total = norms.norm(dim=1)
    coef = (limit / (total + 1e-6)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(coef.view((-1,) + (1,) * (g.dim() - 1)))


def _step_schedulers(
    members: Sequence[MemberTraining],
    active: torch.Tensor,
    progress: list[MemberProgress],
    interval: str,
    index: int,
    plateau: bool,
    metrics: dict[str, torch.Tensor] | None = None,
) -> None:
    """Step the schedulers Lightning would step here (``index`` counts from 1), per member."""
    metrics = metrics or {}
    for i in _members(active):
        for plan in members[i].schedulers:
            if plan.on_plateau != plateau or plan.interval != interval or index % plan.frequency:
                continue
            if plan.on_plateau:
                if plan.monitor is None or plan.monitor not in metrics:
                    continue
                plan.scheduler.step(float(metrics[plan.monitor][i]))
            else:
                plan.scheduler.step()
            progress[i].schedulers_stepped(1)


def _on_step(logs: StepLogs) -> dict[str, torch.Tensor]:
    return {name: value for name, value in logs.values.items() if logs.options[name].on_step}


def _batch_size(batch: Any) -> int:
    """Lightning's inference: the first dimension of the first tensor in the batch (1 when it
    holds none)."""
    return _first_tensor_size(batch) or 1


def _first_tensor_size(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _first_tensor_size(item)
            if size is not None:
                return size
    return None  # a string, a number: not what Lightning counts


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
