"""An app's ``trainer.fit(model, ...)`` read as a member of a fused group, or the reasons it
cannot be one.

What Lightning's ``fit`` would train on is resolved as Lightning resolves it (the loaders
given, else the datamodule's, else the module's own), ``configure_optimizers`` read in every
form Lightning accepts, and the Trainer read for what shapes training; the data and module
hooks ``fit`` runs first (prepare_data, setup, configure_model) run here, in its order.
Anything that would run inside training and that the fused loop does not run for each member
is a reason to run alone: several devices, several optimizers or loaders, a hook of the
module or a callback that acts during training. Lightning is never imported here: its
objects are read by their attributes and class names, whichever namespace the app uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from furcate_hydra.fusion.fused_fit import MemberTraining, SchedulerPlan
from furcate_hydra.fusion.lineage import defines, is_lightning
from furcate_hydra.fusion.module_values import module_values
from furcate_hydra.fusion.optimizer import optimizer_refusals
from furcate_hydra.fusion.probe import probe_steps
from furcate_hydra.fusion.random_states import StreamsKept, capture_streams, loader_generators
from furcate_hydra.fusion.refusals import module_refusals
from furcate_hydra.fusion.sample_batch import sample_batch
from furcate_hydra.fusion.settings import TrainingShape
from furcate_hydra.fusion.step_reads import is_read

# LightningModule hooks Lightning calls during training, which the fused loop does not call
TRAINING_HOOKS = (
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "optimizer_step", "optimizer_zero_grad",
    "configure_gradient_clipping", "lr_scheduler_step", "backward", "on_train_end",
)  # fmt: skip
# callbacks whose work the fused path does for each member itself, or that only show progress
KNOWN_CALLBACKS = (
    "ModelCheckpoint", "EarlyStopping", "TQDMProgressBar", "RichProgressBar", "ProgressBar",
    "ModelSummary", "RichModelSummary",
)  # fmt: skip


@dataclass
class FitCall:
    """One member's ``fit``: what it trains and how, or why it cannot join a group."""

    shape: TrainingShape | None = None
    train_loader: Any = None
    val_loader: Any = None
    member: MemberTraining | None = None
    reasons: list[str] = field(default_factory=list)
    # the random states its training starts from (after fit's data and module hooks)
    streams: dict[str, Any] | None = None
    # what its steps read of its module that its group must share (path, value)
    step_values: dict[str, str] = field(default_factory=dict)

    @property
    def fusable(self) -> bool:
        return not self.reasons


def read_fit_call(
    trainer: Any,
    model: Any,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: Any = None,
) -> FitCall:
    """Read ``trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)``."""
    call = FitCall()
    if hasattr(train_dataloaders, "train_dataloader") and datamodule is None:
        datamodule, train_dataloaders = train_dataloaders, None  # fit(model, datamodule)
    _prepare(model, datamodule)
    call.reasons += _trainer_refusals(trainer)
    call.reasons += module_refusals(model)
    call.reasons += [
        f"its {hook} runs inside training" for hook in TRAINING_HOOKS if defines(model, hook)
    ]
    if not call.reasons:
        call.shape = TrainingShape.from_trainer(trainer)
        call.reasons += call.shape.refusals()
    train, val, reasons = _loaders(
        model, train_dataloaders, val_dataloaders, datamodule, call.shape
    )
    call.train_loader, call.val_loader = train, val
    call.reasons += reasons
    if call.reasons:
        return call
    generators = loader_generators(train, val)
    call.streams = capture_streams(generators)
    with StreamsKept(generators):  # samples read as the member's own run never reads them
        probe = probe_steps(model, sample_batch(train), sample_batch(val))
    call.reasons += probe.reasons
    if call.reasons:
        return call
    call.step_values = {
        path: value
        for path, value in module_values(model).items()
        if is_read(path, probe.reads) and path not in probe.exact_floats
    }
    optimizer, schedulers, reasons = read_optimizers(model.configure_optimizers())
    call.reasons += reasons
    if any(plan.on_plateau for plan in schedulers) and _app_checkpoints(trainer):
        # its files hold the scheduler as before the last epoch's plateau step
        call.reasons.append("its ModelCheckpoint saves before its plateau scheduler's last step")
    if optimizer is not None and not call.reasons:
        call.reasons += optimizer_refusals([optimizer])
        call.member = MemberTraining(model, optimizer, schedulers, call.streams)
    return call


def read_optimizers(
    configured: Any,
) -> tuple[torch.optim.Optimizer | None, list[SchedulerPlan], list[str]]:
    """``configure_optimizers()``'s result, in any form Lightning accepts: one optimizer and
    its schedulers, or the reasons it is not one optimizer."""
    schedulers: list[Any] = []
    optimizers: list[Any]
    if configured is None:
        return None, [], ["it has no optimizer"]
    if isinstance(configured, dict):
        optimizers = [configured.get("optimizer")]
        if configured.get("lr_scheduler") is not None:
            schedulers = [configured["lr_scheduler"]]
    elif isinstance(configured, torch.optim.Optimizer):
        optimizers = [configured]
    elif (
        isinstance(configured, (list, tuple))
        and len(configured) == 2
        and all(isinstance(part, (list, tuple)) for part in configured)
    ):
        optimizers, schedulers = list(configured[0]), list(configured[1])
    elif isinstance(configured, (list, tuple)):
        optimizers = list(configured)
        if optimizers and all(isinstance(item, dict) for item in optimizers):
            return _from_dicts(optimizers)
    else:
        return None, [], [f"its configure_optimizers returned a {type(configured).__name__}"]
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        return None, [], [f"it has {len(optimizers)} optimizers"]
    plans = [_plan(item) for item in schedulers]
    return optimizers[0], plans, []


def _from_dicts(
    items: list[dict[str, Any]],
) -> tuple[torch.optim.Optimizer | None, list[SchedulerPlan], list[str]]:
    if len(items) != 1:
        return None, [], [f"it has {len(items)} optimizers"]
    return read_optimizers(items[0])


def _plan(item: Any) -> SchedulerPlan:
    """A scheduler, or Lightning's lr_scheduler_config dict around one."""
    if isinstance(item, dict):
        return SchedulerPlan(
            scheduler=item["scheduler"],
            interval=str(item.get("interval", "epoch")),
            frequency=int(item.get("frequency", 1)),
            monitor=item.get("monitor"),
        )
    # a plateau scheduler given bare needs the monitor Lightning would refuse it without
    return SchedulerPlan(scheduler=item)


def _prepare(model: Any, datamodule: Any) -> None:
    """What Lightning's ``fit`` runs before it trains, in its order: the data prepared and set
    up, the module set up and its layers configured (Lightning asks both to tolerate a second
    call, which a member that runs alone gets from its own ``fit``)."""
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    for hook, args in (("prepare_data", ()), ("setup", ("fit",)), ("configure_model", ())):
        if defines(model, hook):
            getattr(model, hook)(*args)


def _trainer_refusals(trainer: Any) -> list[str]:
    reasons = []
    world = int(getattr(trainer, "world_size", 1) or 1)
    if world > 1:
        reasons.append(f"it trains on {world} processes")
    if int(getattr(trainer, "num_devices", 1) or 1) > 1:
        reasons.append(f"it trains on {trainer.num_devices} devices")
    for callback in getattr(trainer, "callbacks", []):
        kind = type(callback)
        if kind.__module__.startswith("furcate_hydra"):
            continue  # furcate's own: the fused path does their work for each member
        known = kind.__name__ in KNOWN_CALLBACKS and is_lightning(kind)
        if not known:
            reasons.append(f"its callback {kind.__name__} acts during training")
        elif kind.__name__ == "ModelCheckpoint":
            reasons += _checkpoint_refusals(callback)
    return reasons


def _checkpoint_refusals(callback: Any) -> list[str]:
    """Why the files of an app's ``ModelCheckpoint`` without a monitor cannot be its fused
    run's: a group saves them once, as at the last epoch's end (``save_app_checkpoints``)."""
    if getattr(callback, "monitor", None):
        # its best checkpoints are its epochs' own, which a group keeps no file of
        return [f"its ModelCheckpoint keeps the best checkpoints by {callback.monitor}"]
    within = getattr(callback, "_every_n_train_steps", 0)
    if within or getattr(callback, "_train_time_interval", None):
        return ["its ModelCheckpoint saves within epochs"]
    every = getattr(callback, "_every_n_epochs", 1)
    if getattr(callback, "save_top_k", 1) not in (0, 1) or every != 1:
        return ["its ModelCheckpoint keeps files of earlier epochs"]
    return []


def _app_checkpoints(trainer: Any) -> bool:
    return any(
        type(cb).__name__ == "ModelCheckpoint" and is_lightning(type(cb))
        for cb in getattr(trainer, "callbacks", [])
    )


def _loaders(
    model: Any, train: Any, val: Any, datamodule: Any, shape: TrainingShape | None
) -> tuple[Any, Any, list[str]]:
    """The loaders ``fit`` would use (Lightning's order), and why they cannot be shared."""
    if datamodule is not None:
        if train is not None or val is not None:
            return None, None, ["it passes loaders and a datamodule"]
        source: Any = datamodule
    else:
        source = model
    if train is None:
        train = source.train_dataloader() if defines(source, "train_dataloader") else None
    if val is None and defines(source, "val_dataloader"):
        val = source.val_dataloader()
    if shape is not None and shape.limit_val_batches in (0, 0.0):
        val = None
    reasons = []
    for label, loader in (("training", train), ("validation", val)):
        if loader is None:
            if label == "training":
                reasons.append("it has no training loader")
        elif not isinstance(loader, DataLoader):
            reasons.append(f"its {label} data is a {type(loader).__name__}, not one DataLoader")
    return train, val, reasons
