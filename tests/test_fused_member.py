"""A fused member's own Trainer ends its fit as its own run would have: after the group's
leader trained it, the app's code after ``fit`` sees the same Trainer and module."""

from __future__ import annotations

import itertools
import logging
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from furcate_hydra.fusion.coordinator import Alone, Offer, Trained, lead
from furcate_hydra.fusion.fit_call import read_fit_call
from furcate_hydra.fusion.rendezvous import Joined, Leading
from furcate_hydra.lightning._fused_member import finish_trained
from tests.test_fusion_engine import (
    QUIET,
    TinyMLP,
    _assert_same_weights,
    _loaders,
    _member,
    _state_equal,
)

CONFIGS = [(3e-2, 0.0), (1e-2, 0.0), (3e-3, 0.0), (1e-1, 0.5)]


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    warnings.filterwarnings("ignore", module="lightning")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def stopper() -> EarlyStopping:
    return EarlyStopping(monitor="val_loss", patience=1, min_delta=0.01)


def test_each_members_trainer_ends_fit_where_its_own_run_ended() -> None:
    train, val = _loaders()
    modules = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    trainers: list[Any] = [
        L.Trainer(**QUIET, max_epochs=12, callbacks=[stopper()]) for _ in CONFIGS
    ]
    offers = [
        Offer(read_fit_call(t, m, train, val), list(t.callbacks), L.__version__)
        for t, m in zip(trainers, modules, strict=True)
    ]
    ends = lead(Leading([Joined(f"job{i}", o, None) for i, o in enumerate(offers)]), fuse_max=8)
    for i, (lr, wd) in enumerate(CONFIGS):
        end = ends[f"job{i}"]
        assert isinstance(end, Trained)
        finish_trained(L.Trainer.fit, trainers[i], modules[i], end, train, val)
        alone = _member(i, lr, wd)
        own: Any = L.Trainer(**QUIET, max_epochs=12, callbacks=[stopper()])
        own.fit(alone, train, val)
        mine = trainers[i]
        assert (mine.current_epoch, mine.global_step) == (own.current_epoch, own.global_step)
        _assert_same_weights(modules[i], alone)
        _state_equal(mine.optimizers[0].state_dict(), own.optimizers[0].state_dict())
        assert mine.callback_metrics.keys() == own.callback_metrics.keys()
        for name, value in own.callback_metrics.items():
            torch.testing.assert_close(mine.callback_metrics[name], value, msg=name)
        ours, theirs = mine.early_stopping_callback, own.early_stopping_callback
        assert (ours.wait_count, ours.stopped_epoch) == (theirs.wait_count, theirs.stopped_epoch)
        # the app's code after fit: a validation on the trained module
        after = mine.validate(modules[i], val, verbose=False)
        assert after == own.validate(alone, val, verbose=False)
    assert len({t.current_epoch for t in trainers}) > 1  # members ended at different epochs


def test_a_member_whose_optimizer_differs_runs_alone_and_its_group_trains() -> None:
    train, val = _loaders()
    modules = [_member(0, 1e-2, 0.0), _member(1, 3e-2, 0.0), _member(2, 1e-2, 0.0, optimizer="sgd")]
    offers = [
        Offer(read_fit_call(L.Trainer(**QUIET, max_epochs=2), m, train, val), [], L.__version__)
        for m in modules
    ]
    ends = lead(Leading([Joined(f"job{i}", o, None) for i, o in enumerate(offers)]), fuse_max=8)
    assert isinstance(ends["job0"], Trained) and isinstance(ends["job1"], Trained)
    assert ends["job0"].group == ("job0", "job1")
    alone = ends["job2"]
    assert not isinstance(alone, Trained)
    assert (
        alone.reason
        == "its optimizer differs (SGD(nesterov=True), not Adam(decoupled_weight_decay=False))"
    )


class FailsInItsThirdStep(TinyMLP):
    """A step that passes the probe and fails later, as a step can on data it had not seen."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 2:
            raise RuntimeError("a step that failed in training")
        return super().training_step(batch, batch_idx)


def test_a_group_whose_training_fails_sends_every_member_to_run_alone() -> None:
    train, val = _loaders()
    modules = []
    for i in range(2):
        torch.manual_seed(100 + i)
        modules.append(FailsInItsThirdStep(1e-2 * (i + 1), 0.0))
    before = {k: v.clone() for k, v in modules[0].state_dict().items()}
    offers = [
        Offer(read_fit_call(L.Trainer(**QUIET, max_epochs=2), m, train, val), [], L.__version__)
        for m in modules
    ]
    ends = lead(Leading([Joined(f"job{i}", o, None) for i, o in enumerate(offers)]), fuse_max=8)
    for end in ends.values():
        assert isinstance(end, Alone)
        assert end.reason == (
            "its group's training failed (RuntimeError: a step that failed in training)"
        )
    # the leader's own model is as at its fit, for its own fit to start from
    assert all(torch.equal(before[k], v) for k, v in modules[0].state_dict().items())


def train_alone_for_a_while(directory: str, key: str, spans: Any) -> None:
    """A member told to run alone: its own fit (a sleep) within its turn on the slot."""
    import time
    from pathlib import Path
    from types import SimpleNamespace

    from furcate_hydra.lightning._fused_group import GroupEnv
    from furcate_hydra.lightning._fused_member import alone_in_group

    group = GroupEnv(Path(directory), 3, key, 8, 30.0)
    training: Any = SimpleNamespace(checkpoint=SimpleNamespace(last_saved=None))
    with alone_in_group(group, training) as kept:
        began = time.monotonic()
        time.sleep(0.3)
        spans.put((key, began, time.monotonic(), kept))


def test_members_left_alone_train_one_at_a_time_on_their_slot(tmp_path: Any) -> None:
    """A group's members that run alone take the slot in turn, as jobs do without fusion
    (a BatchNorm model swept with fuse=auto started every member's training at once)."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    spans = fork.Queue()
    members = [
        fork.Process(target=train_alone_for_a_while, args=(str(tmp_path), f"job{i}", spans))
        for i in range(3)
    ]
    for process in members:
        process.start()
    for process in members:
        process.join(timeout=30)
    ran = sorted(spans.get(timeout=5)[1:3] for _ in members)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(ran)), ran
