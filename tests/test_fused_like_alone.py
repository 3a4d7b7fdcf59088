"""A fused member sees what its own run sees, or says why it runs alone: where training is,
every value its steps read, its schedulers' metrics, its optimizer's flags, its random states.

Each test fuses members as the fused path reads them (``read_fit_call``) and compares each
with the same module trained by Lightning alone, bitwise; or checks the reason that keeps a
member out of a group (``Offer.signature``'s differences).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from furcate_hydra.fusion.coordinator import Offer
from furcate_hydra.fusion.fit_call import read_fit_call
from furcate_hydra.fusion.fused_fit import fused_fit
from tests.test_fusion_engine import (
    CONFIGS,
    QUIET,
    Recorder,
    TinyMLP,
    _assert_same_weights,
    _loaders,
)


def _built(cls: type[TinyMLP], index: int, **kw: Any) -> TinyMLP:
    torch.manual_seed(100 + index)  # each member's own initial weights
    return cls(**kw)


def _fused_and_alone(
    cls: type[Any], configs: list[dict[str, Any]], trainer_kwargs: dict[str, Any]
) -> tuple[list[Any], list[Any], Any]:
    """Each config fused (read as the fused path reads it) and trained by Lightning alone."""
    train, val = _loaders()
    fused, calls = [], []
    for i, kw in enumerate(configs):  # each read at its fit, from its own random states
        fused.append(_built(cls, i, **kw))
        calls.append(read_fit_call(L.Trainer(**QUIET, **trainer_kwargs), fused[-1], train, val))
    assert all(call.fusable for call in calls), [call.reasons for call in calls]
    signatures = [Offer(call).signature for call in calls]
    assert all(signature == signatures[0] for signature in signatures), [
        signature.differences(signatures[0])  # type: ignore[union-attr, arg-type]
        for signature in signatures
    ]
    shape = calls[0].shape
    assert shape is not None
    members = [call.member for call in calls if call.member is not None]
    outcome = fused_fit(members, shape, train, val, Recorder(len(configs)))
    alone = []
    for i, kw in enumerate(configs):
        module = _built(cls, i, **kw)
        L.Trainer(**QUIET, **trainer_kwargs).fit(module, *_loaders())
        alone.append(module)
    return fused, alone, outcome


def _reasons(cls: type[Any], configs: list[dict[str, Any]]) -> list[str]:
    """Why the second config cannot join the first's group (empty: it can)."""
    train, val = _loaders()
    offers = []
    for i, kw in enumerate(configs):
        call = read_fit_call(L.Trainer(**QUIET, max_epochs=2), _built(cls, i, **kw), train, val)
        assert call.fusable, call.reasons
        offers.append(Offer(call))
    first, second = (offer.signature for offer in offers)
    assert first is not None and second is not None
    return second.differences(first)


class EpochWarmup(TinyMLP):
    """A loss weight warmed up by the epoch and the optimizer steps, read in the step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        warmup = min(1.0, (self.global_step + 1) / 7) * (1 + self.current_epoch)
        loss = F.cross_entropy(self(x), y) * warmup
        self.log("train_loss", loss)
        return loss


def test_a_step_that_reads_the_epoch_and_step_trains_as_its_own_run() -> None:
    configs = [{"lr": lr, "weight_decay": wd} for lr, wd in CONFIGS]
    fused, alone, _ = _fused_and_alone(EpochWarmup, configs, {"max_epochs": 3})
    for mine, theirs in zip(fused, alone, strict=True):
        _assert_same_weights(mine, theirs)


class ReadsTrainer(TinyMLP):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) / self.trainer.num_training_batches


def test_a_step_that_reads_more_of_its_trainer_runs_alone_with_the_reason() -> None:
    train, val = _loaders()
    module = _built(ReadsTrainer, 0, lr=0.1, weight_decay=0.0)
    call = read_fit_call(L.Trainer(**QUIET, max_epochs=1), module, train, val)
    assert call.reasons == ["its steps read self.trainer.num_training_batches"]


class Smoothed(TinyMLP):
    """Label smoothing on a child loss, a nested config read through hparams, a float used
    other than as a factor, and a nested value only the optimizer reads."""

    def __init__(
        self,
        lr: float,
        weight_decay: float,
        smoothing: float = 0.0,
        loss: dict[str, Any] | None = None,
        alpha: float = 1.0,
        sharpness: float = 1.0,
        optim: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(lr, weight_decay)
        self.save_hyperparameters()
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=smoothing)
        self.alpha = alpha
        self.sharpness = sharpness

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h: Any = self.hparams
        weight = (h.loss or {}).get("weight", 1.0)
        loss: torch.Tensor = self.loss_fn(self(x), y) * weight * self.alpha
        return loss * math.exp(self.sharpness - 1.0)


@pytest.mark.parametrize(
    ("differs", "reason"),
    [
        ({"smoothing": 0.1}, "its module's loss_fn.label_smoothing differs (0.1, not 0.0)"),
        ({"loss": {"weight": 0.5}}, "its module's hparams.loss.weight differs (0.5, not 1.0)"),
        ({"sharpness": 2.0}, "its module's sharpness differs (2.0, not 1.0)"),
    ],
)
def test_a_value_its_steps_read_that_differs_keeps_a_member_alone(
    differs: dict[str, Any], reason: str
) -> None:
    base = {"lr": 0.1, "weight_decay": 0.0, "loss": {"weight": 1.0}}
    assert _reasons(Smoothed, [base, {**base, **differs}]) == [f"{reason} and its steps read it"]


def test_values_a_group_gives_each_member_or_its_steps_never_read_may_differ() -> None:
    first = {"lr": 0.1, "weight_decay": 0.0, "alpha": 1.0, "optim": {"betas": [0.9, 0.99]}}
    # a factor of the loss (a tensor per member, checked bitwise); what only the optimizer reads
    second = {**first, "lr": 0.01, "alpha": 0.3, "optim": {"betas": [0.8, 0.9]}}
    assert _reasons(Smoothed, [first, second]) == []
    fused, alone, _ = _fused_and_alone(Smoothed, [first, second], {"max_epochs": 2})
    for mine, theirs in zip(fused, alone, strict=True):
        _assert_same_weights(mine, theirs)


class Locked(TinyMLP):
    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__(lr, weight_decay)
        self.lock = threading.Lock()


def test_a_member_that_cannot_be_sent_to_its_group_runs_alone_with_the_reason() -> None:
    from furcate_hydra.lightning._fused_member import _cannot_send

    train, val = _loaders()
    module = _built(Locked, 0, lr=0.1, weight_decay=0.0)
    offer = Offer(read_fit_call(L.Trainer(**QUIET, max_epochs=1), module, train, val))
    assert _cannot_send(offer) == (
        "its module, optimizer or callbacks cannot be sent to its group "
        "(cannot pickle '_thread.lock' object)"
    )


class Plateau(TinyMLP):
    """A plateau scheduler that halves the learning rate whenever val_loss falls (mode=max),
    so that it steps in every epoch it sees the metric."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)  # type: ignore[attr-defined]
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}


@pytest.mark.parametrize(
    "trainer_kwargs",
    [
        {"max_epochs": 4},
        # validation every 4 batches counted across epochs (6 batches an epoch)
        {"max_epochs": 3, "val_check_interval": 4, "check_val_every_n_epoch": None},
    ],
)
def test_a_plateau_scheduler_on_a_validation_metric_steps_as_in_its_own_run(
    trainer_kwargs: dict[str, Any],
) -> None:
    configs = [{"lr": lr, "weight_decay": 0.0} for lr, _ in CONFIGS[:2]]
    fused, alone, _ = _fused_and_alone(Plateau, configs, trainer_kwargs)
    for mine, theirs in zip(fused, alone, strict=True):
        _assert_same_weights(mine, theirs)


class DecoupledAdam(TinyMLP):
    def configure_optimizers(self) -> Any:
        h: Any = self.hparams
        return torch.optim.Adam(
            self.parameters(), lr=h.lr, weight_decay=h.weight_decay, decoupled_weight_decay=True
        )


def test_adam_with_decoupled_weight_decay_steps_as_torch_does() -> None:
    configs = [{"lr": lr, "weight_decay": wd} for lr, wd in CONFIGS if wd]
    fused, alone, _ = _fused_and_alone(DecoupledAdam, configs, {"max_epochs": 2})
    for mine, theirs in zip(fused, alone, strict=True):
        _assert_same_weights(mine, theirs)


def test_an_optimizer_flag_the_fused_step_does_not_implement_is_a_reason() -> None:
    from furcate_hydra.fusion.optimizer import optimizer_refusals

    params = [nn.Parameter(torch.zeros(2))]
    assert optimizer_refusals([torch.optim.Adam(params, foreach=True)]) == [
        "its optimizer sets foreach=True"
    ]
    assert optimizer_refusals([torch.optim.SGD(params, lr=0.1, maximize=True)]) == [
        "its optimizer sets maximize=True"
    ]


def test_members_of_other_seeds_end_with_the_random_states_their_own_runs_end_with() -> None:
    configs = [{"lr": lr, "weight_decay": wd} for lr, wd in CONFIGS]
    fused, alone, outcome = _fused_and_alone(TinyMLP, configs, {"max_epochs": 2})
    for i, kw in enumerate(configs):
        own = _built(TinyMLP, i, **kw)
        L.Trainer(**QUIET, max_epochs=2).fit(own, *_loaders())
        ended = torch.get_rng_state()  # where its own run left torch's stream
        assert torch.equal(outcome.streams[i]["rng"]["torch"], ended), i
        _assert_same_weights(fused[i], alone[i])


@pytest.mark.parametrize(
    ("callback", "reason"),
    [
        ("LearningRateMonitor", "its callback LearningRateMonitor acts during training"),
        ("Timer", "its callback Timer acts during training"),
        ("every_epoch_kept", "its ModelCheckpoint keeps files of earlier epochs"),
        ("every_n_steps", "its ModelCheckpoint saves within epochs"),
    ],
)
def test_callbacks_whose_work_a_group_does_not_do_keep_a_member_alone(
    callback: str, reason: str
) -> None:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, Timer

    makers: dict[str, Callable[[], L.Callback]] = {
        "LearningRateMonitor": LearningRateMonitor,
        "Timer": Timer,
        "every_epoch_kept": lambda: ModelCheckpoint(save_top_k=-1),
        "every_n_steps": lambda: ModelCheckpoint(every_n_train_steps=2),
    }
    made = makers[callback]()
    trainer = L.Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=1, callbacks=[made])
    train, val = _loaders()
    call = read_fit_call(trainer, _built(TinyMLP, 0, lr=0.1, weight_decay=0.0), train, val)
    assert call.reasons == [reason]


def test_a_stop_asked_before_min_epochs_waits_for_them_as_lightning_does() -> None:
    """Early stopping asks member 0 to stop after its first epoch; with ``min_epochs=3``
    Lightning trains it on to the end of its third, and so does its group."""
    train, val = _loaders()
    configs = [{"lr": lr, "weight_decay": wd} for lr, wd in CONFIGS[:2]]
    fused = [_built(TinyMLP, i, **kw) for i, kw in enumerate(configs)]
    trainer_kwargs: dict[str, Any] = {"max_epochs": 5, "min_epochs": 3}
    calls = [read_fit_call(L.Trainer(**QUIET, **trainer_kwargs), m, train, val) for m in fused]
    shape = calls[0].shape
    assert shape is not None and shape.min_epochs == 3
    members = [call.member for call in calls if call.member is not None]
    outcome = fused_fit(members, shape, train, val, Recorder(2, stop_after_epoch={0: 0}))
    assert outcome.epochs == [3, 5]
    for i, epochs in ((0, 3), (1, 5)):
        alone = _built(TinyMLP, i, **configs[i])
        L.Trainer(**QUIET, max_epochs=epochs).fit(alone, *_loaders())
        _assert_same_weights(fused[i], alone)
