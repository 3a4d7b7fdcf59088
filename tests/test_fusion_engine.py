"""The fused loop against Lightning's own: each member's weights equal its run alone, bitwise.

Every member here is also trained by a real ``lightning.pytorch`` Trainer on its own; the fused
loop must end each member on the very same tensors (the CPU is deterministic: no tolerance).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.fusion.fit_call import read_fit_call, read_optimizers
from furcate_hydra.fusion.fused_fit import MemberTraining, SchedulerPlan, fused_fit
from furcate_hydra.fusion.optimizer import optimizer_refusals
from furcate_hydra.fusion.probe import step_refusals
from furcate_hydra.fusion.random_states import capture_streams, loader_generators
from furcate_hydra.fusion.refusals import module_refusals
from furcate_hydra.fusion.settings import TrainingShape
from furcate_hydra.fusion.signature import FusionSignature
from furcate_hydra.fusion.step_logs import LogOptions

QUIET: dict[str, Any] = {"logger": False, "enable_checkpointing": False, "accelerator": "cpu"}
QUIET |= {"enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0}


class TinyMLP(L.LightningModule):
    def __init__(
        self, lr: float, weight_decay: float, optimizer: str = "adam", scheduler: str = "none"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        h: Any = self.hparams
        params = self.parameters()
        if h.optimizer == "adam":
            opt: torch.optim.Optimizer = torch.optim.Adam(
                params, lr=h.lr, weight_decay=h.weight_decay
            )
        elif h.optimizer == "adamw":
            opt = torch.optim.AdamW(params, lr=h.lr, weight_decay=h.weight_decay)
        else:
            opt = torch.optim.SGD(
                params, lr=h.lr, weight_decay=h.weight_decay, momentum=0.9, nesterov=True
            )
        if h.scheduler == "step":
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)}
        if h.scheduler == "plateau":
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}
        return opt


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    warnings.filterwarnings("ignore", module="lightning")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def _loaders() -> tuple[DataLoader[Any], DataLoader[Any]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=generator)
    y = torch.randint(0, 3, (96,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=16), DataLoader(
        TensorDataset(x[:32], y[:32]), batch_size=16
    )


CONFIGS = [(1e-1, 0.0), (1e-2, 0.1), (3e-3, 0.0), (1e-3, 0.05)]


def _member(index: int, lr: float, decay: float, **kw: Any) -> TinyMLP:
    torch.manual_seed(100 + index)  # each member's own initial weights
    return TinyMLP(lr, decay, **kw)


class Recorder:
    """An observer that keeps what the fused loop reports and stops members when told."""

    def __init__(self, count: int, stop_after_epoch: dict[int, int] | None = None) -> None:
        self.count = count
        self.stop_after_epoch = stop_after_epoch or {}
        self.steps: list[tuple[int, dict[str, torch.Tensor], dict[str, LogOptions]]] = []
        self.validations: list[dict[str, torch.Tensor]] = []
        self.epochs: list[dict[str, torch.Tensor]] = []

    def train_step(
        self, step: int, epoch: int, logs: dict[str, torch.Tensor], options: dict[str, LogOptions]
    ) -> None:
        self.steps.append((step, logs, options))

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        self.validations.append(means)
        return torch.tensor([self.stop_after_epoch.get(i) == epoch for i in range(self.count)])

    def train_epoch_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> None:
        self.epochs.append(means)


def _fuse(
    modules: list[TinyMLP], trainer_kwargs: dict[str, Any], recorder: Recorder, mode: str = "vmap"
) -> None:
    """Each member's fit call read as the fused path reads it, then one fused fit."""
    train, val = _loaders()
    calls = [read_fit_call(L.Trainer(**QUIET, **trainer_kwargs), m, train, val) for m in modules]
    assert all(call.fusable for call in calls), [call.reasons for call in calls]
    members = [call.member for call in calls if call.member is not None]
    shape = calls[0].shape
    assert shape is not None
    fused_fit(members, shape, train, val, recorder, step_mode=mode)


def _alone(
    index: int, lr: float, decay: float, trainer_kwargs: dict[str, Any], **kw: Any
) -> tuple[TinyMLP, Any]:
    module = _member(index, lr, decay, **kw)
    trainer = L.Trainer(**QUIET, **trainer_kwargs)
    train, val = _loaders()
    trainer.fit(module, train, val)
    return module, trainer


def _assert_same_weights(fused: nn.Module, alone: nn.Module) -> None:
    for (name, a), b in zip(fused.state_dict().items(), alone.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name}: max difference {(a - b).abs().max().item()}"


@pytest.mark.parametrize("mode", ["vmap", "loop"])
@pytest.mark.parametrize(
    ("optimizer", "scheduler", "trainer_kwargs"),
    [
        ("adam", "none", {"max_epochs": 4}),
        (
            "adamw",
            "step",
            {"max_epochs": 5, "accumulate_grad_batches": 4, "gradient_clip_val": 0.5},
        ),
        (
            "sgd",
            "step",
            {"max_steps": 9, "gradient_clip_val": 0.2, "gradient_clip_algorithm": "value"},
        ),
        ("adam", "plateau", {"max_epochs": 4, "limit_train_batches": 4}),
    ],
)
def test_each_member_ends_on_the_weights_of_its_own_run(
    optimizer: str, scheduler: str, trainer_kwargs: dict[str, Any], mode: str
) -> None:
    kw = {"optimizer": optimizer, "scheduler": scheduler}
    fused = [_member(i, lr, wd, **kw) for i, (lr, wd) in enumerate(CONFIGS)]
    recorder = Recorder(len(CONFIGS))
    _fuse(fused, trainer_kwargs, recorder, mode)
    for i, (lr, wd) in enumerate(CONFIGS):
        alone, trainer = _alone(i, lr, wd, trainer_kwargs, **kw)
        _assert_same_weights(fused[i], alone)
        # what the member logged is what its own run logged
        epoch_loss = recorder.epochs[-1]["train_loss"][i]
        torch.testing.assert_close(epoch_loss, trainer.callback_metrics["train_loss_epoch"])
        torch.testing.assert_close(
            recorder.validations[-1]["val_loss"][i], trainer.callback_metrics["val_loss"]
        )


def test_a_stopped_member_keeps_the_weights_its_run_stopped_on() -> None:
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    recorder = Recorder(len(CONFIGS), stop_after_epoch={1: 0, 2: 2})
    _fuse(fused, {"max_epochs": 4}, recorder)
    for i, epochs in ((0, 4), (1, 1), (2, 3)):
        alone, _ = _alone(i, *CONFIGS[i], {"max_epochs": epochs})
        _assert_same_weights(fused[i], alone)


def test_each_step_reports_every_members_logged_value_with_lightnings_defaults() -> None:
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    recorder = Recorder(len(CONFIGS))
    _fuse(fused, {"max_epochs": 1}, recorder)
    steps = [step for step, _, _ in recorder.steps]
    assert steps == list(range(1, 7))  # 96 samples, batches of 16: six optimizer steps
    _, logs, options = recorder.steps[0]
    assert logs["train_loss"].shape == (len(CONFIGS),)
    assert options["train_loss"].on_step and options["train_loss"].on_epoch


class WithBatchNorm(TinyMLP):
    def __init__(self) -> None:
        super().__init__(1e-3, 0.0)
        self.norm = nn.BatchNorm1d(16)


class WithDropout(TinyMLP):
    def __init__(self) -> None:
        super().__init__(1e-3, 0.0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 3))


def test_modules_that_keep_state_or_draw_random_numbers_are_refused_with_the_layer_named() -> None:
    assert module_refusals(_member(0, 1e-3, 0.0)) == []
    assert module_refusals(WithBatchNorm()) == ["BatchNorm1d keeps running statistics"]
    assert module_refusals(WithDropout()) == ["Dropout draws random numbers in training"]
    manual = _member(0, 1e-3, 0.0)
    manual.automatic_optimization = False
    assert module_refusals(manual) == ["it optimizes by hand (automatic_optimization=False)"]


class WithMetric(TinyMLP):
    def __init__(self) -> None:
        from torchmetrics.classification import MulticlassAccuracy

        super().__init__(1e-3, 0.0)
        self.accuracy = MulticlassAccuracy(num_classes=3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.accuracy(logits, y)
        return F.cross_entropy(logits, y)


class Branching(TinyMLP):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if loss > 1.0:  # a Python branch on each member's own value
            return loss * 2
        return loss


def test_the_probe_names_what_only_running_a_step_shows() -> None:
    train, val = _loaders()
    batch = next(iter(train))
    assert step_refusals(_member(0, 1e-3, 0.0), batch, next(iter(val))) == []
    metric = WithMetric()
    assert step_refusals(metric, batch, None) == ["MulticlassAccuracy updated inside training_step"]
    assert metric.accuracy.update_count == 0  # the member's own metric was not touched
    assert step_refusals(Branching(1e-3, 0.0), batch, None) == [
        "its training_step branches on a tensor's value"
    ]


def test_optimizers_without_a_fused_form_are_refused() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    assert optimizer_refusals([torch.optim.Adam(params), torch.optim.Adam(params, lr=0.1)]) == []
    assert optimizer_refusals([torch.optim.RMSprop(params)]) == [
        "its optimizer RMSprop has no fused form (fused: SGD, Adam, AdamW)"
    ]
    assert optimizer_refusals([torch.optim.Adam(params, amsgrad=True)]) == [
        "its optimizer sets amsgrad=True"
    ]
    assert optimizer_refusals([torch.optim.Adam(params), torch.optim.SGD(params)]) == [
        "its optimizer differs (Adam, SGD)"
    ]


def _signature(
    module: nn.Module, batch_size: int = 16, shuffle: bool = False, **trainer: Any
) -> FusionSignature:
    train, val = _loaders()
    train = DataLoader(train.dataset, batch_size=batch_size, shuffle=shuffle)
    shape = TrainingShape.from_trainer(L.Trainer(**QUIET, **({"max_epochs": 3} | trainer)))
    streams = capture_streams(loader_generators(train))
    return FusionSignature.of(module, shape, train, val, streams=streams)


def test_members_differing_in_hyperparameters_share_a_signature_and_others_say_why_not() -> None:
    group = _signature(_member(0, 1e-3, 0.0))
    assert _signature(_member(1, 1e-1, 0.3)) == group
    assert _signature(_member(1, 1e-3, 0.0), batch_size=32).differences(group) == [
        "its batch size differs"
    ]
    assert _signature(_member(1, 1e-3, 0.0), max_epochs=4).differences(group) == [
        "its Trainer's max_epochs differs"
    ]
    assert _signature(WithBatchNorm()).differences(group) == ["its module is a WithBatchNorm"]
    wider = _member(1, 1e-3, 0.0)
    wider.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    assert _signature(wider).differences(group) == ["its parameter shapes differ"]
    # a shuffled loader drawing from the global stream: members seeded alike share an order
    first, second = _member(0, 1e-3, 0.0), _member(1, 1e-2, 0.0)
    torch.manual_seed(7)
    shuffled = _signature(first, shuffle=True)
    torch.manual_seed(7)
    assert _signature(second, shuffle=True) == shuffled
    torch.manual_seed(8)
    assert _signature(second, shuffle=True).differences(shuffled) == [
        "its data draws from its random states, which differ from the group's (another seed: "
        "a shuffled order, augmentation or workers)"
    ]
    # unshuffled data draws nothing: members of other seeds share a group
    torch.manual_seed(8)
    assert _signature(second) == group


def _state_equal(fused: dict[str, Any], alone: dict[str, Any]) -> None:
    """Two optimizer state_dicts hold the same tensors and hyperparameters."""
    assert fused["param_groups"] == alone["param_groups"]
    assert fused["state"].keys() == alone["state"].keys()
    for index, entry in alone["state"].items():
        for key, value in entry.items():
            assert torch.equal(
                torch.as_tensor(fused["state"][index][key]), torch.as_tensor(value)
            ), key


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_each_members_optimizer_holds_the_state_its_own_run_ends_with(optimizer: str) -> None:
    kw = {"optimizer": optimizer, "scheduler": "step"}
    fused = [_member(i, lr, wd, **kw) for i, (lr, wd) in enumerate(CONFIGS)]
    train, val = _loaders()
    members = []
    for module in fused:
        configured = module.configure_optimizers()
        members.append(
            MemberTraining(
                module, configured["optimizer"], [SchedulerPlan(configured["lr_scheduler"])]
            )
        )
    shape = TrainingShape.from_trainer(L.Trainer(**QUIET, max_epochs=3))
    fused_fit(members, shape, train, val, Recorder(len(CONFIGS)))
    for i, (lr, wd) in enumerate(CONFIGS):
        _, trainer = _alone(i, lr, wd, {"max_epochs": 3}, **kw)
        _state_equal(members[i].optimizer.state_dict(), trainer.optimizers[0].state_dict())
        assert (
            members[i].schedulers[0].scheduler.state_dict()
            == trainer.lr_scheduler_configs[0].scheduler.state_dict()
        )


def test_members_resumed_from_their_checkpoints_end_as_an_uninterrupted_run() -> None:
    kw = {"optimizer": "adam", "scheduler": "step"}
    train, val = _loaders()

    def training(modules: list[TinyMLP]) -> list[MemberTraining]:
        out = []
        for module in modules:
            configured = module.configure_optimizers()
            plan = SchedulerPlan(configured["lr_scheduler"])
            out.append(MemberTraining(module, configured["optimizer"], [plan]))
        return out

    first = training([_member(i, lr, wd, **kw) for i, (lr, wd) in enumerate(CONFIGS)])
    two = TrainingShape.from_trainer(L.Trainer(**QUIET, max_epochs=2))
    outcome = fused_fit(first, two, train, val, Recorder(len(CONFIGS)))
    # each member's checkpoint, in torch's own forms, read into fresh objects (a new process)
    saved = [
        (m.module.state_dict(), m.optimizer.state_dict(), m.schedulers[0].scheduler.state_dict())
        for m in first
    ]
    resumed = training([_member(i, lr, wd, **kw) for i, (lr, wd) in enumerate(CONFIGS)])
    for member, (weights, optimizer, scheduler) in zip(resumed, saved, strict=True):
        member.module.load_state_dict(weights)
        member.optimizer.load_state_dict(optimizer)
        member.schedulers[0].scheduler.load_state_dict(scheduler)
    four = TrainingShape.from_trainer(L.Trainer(**QUIET, max_epochs=4))
    fused_fit(resumed, four, train, val, Recorder(len(CONFIGS)), start=outcome.progress)
    for i, (lr, wd) in enumerate(CONFIGS):
        alone, _ = _alone(i, lr, wd, {"max_epochs": 4}, **kw)
        _assert_same_weights(resumed[i].module, alone)


class Weighted(TinyMLP):
    """A loss weight kept as a plain number, in ``hparams`` and as an attribute."""

    def __init__(self, lr: float, weight_decay: float, alpha: float, smoothing: float) -> None:
        super().__init__(lr, weight_decay)
        self.save_hyperparameters()
        self.smoothing = smoothing

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h: Any = self.hparams
        loss: torch.Tensor = F.cross_entropy(self(x), y) * h.alpha
        loss = loss + self.smoothing * self(x).pow(2).mean()
        self.log("train_loss", loss)
        return loss


def test_members_differing_in_a_loss_weight_each_train_with_their_own() -> None:
    weights = [(0.5, 0.0), (1.0, 0.1), (2.0, 0.01)]
    train, _ = _loaders()

    def build(i: int, alpha: float, smoothing: float) -> Weighted:
        torch.manual_seed(100 + i)
        return Weighted(1e-2, 0.0, alpha, smoothing)

    fused = [build(i, *w) for i, w in enumerate(weights)]
    members = [MemberTraining(m, m.configure_optimizers()) for m in fused]
    shape = TrainingShape.from_trainer(L.Trainer(**QUIET, max_epochs=2))
    fused_fit(members, shape, train, None, Recorder(len(weights)))
    for i, w in enumerate(weights):
        alone = build(i, *w)
        L.Trainer(**QUIET, max_epochs=2).fit(alone, train)
        _assert_same_weights(fused[i], alone)
        assert fused[i].hparams["alpha"] == w[0] and fused[i].smoothing == w[1]  # left as they were


def test_only_the_floats_that_differ_become_per_member_tensors() -> None:
    from furcate_hydra.fusion.member_scalars import differing_scalars

    first, second = _member(0, 1e-3, 0.0), _member(1, 1e-2, 0.0)
    second.layers_to_skip = 2  # type: ignore[assignment]
    first.layers_to_skip = 1  # type: ignore[assignment]
    # an int that differs is the signature's to judge (where the steps read it)
    assert set(differing_scalars([first, second])) == {"hparams.lr"}


class TwoOptimizers(TinyMLP):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]


class EpochHook(TinyMLP):
    def on_train_epoch_end(self) -> None:
        self.log("seen", 1.0)


class OwnCallback(L.Callback):
    pass


class OwnLoaders(TinyMLP):
    def train_dataloader(self) -> DataLoader[Any]:
        return _loaders()[0]


class Data(L.LightningDataModule):
    def setup(self, stage: str) -> None:
        self.train, self.val = _loaders()

    def train_dataloader(self) -> DataLoader[Any]:
        return self.train

    def val_dataloader(self) -> DataLoader[Any]:
        return self.val


def test_a_fit_call_is_read_where_lightning_would_find_its_data() -> None:
    trainer = L.Trainer(**QUIET, max_epochs=2)
    from_module = read_fit_call(trainer, OwnLoaders(1e-3, 0.0))
    assert from_module.fusable and from_module.val_loader is None
    assert isinstance(from_module.train_loader, DataLoader)
    for call in (
        read_fit_call(trainer, _member(0, 1e-3, 0.0), datamodule=Data()),
        read_fit_call(trainer, _member(0, 1e-3, 0.0), Data()),  # fit(model, datamodule)
    ):
        assert call.fusable, call.reasons
        assert isinstance(call.train_loader, DataLoader) and isinstance(call.val_loader, DataLoader)
        assert call.shape is not None and call.shape.max_epochs == 2


def test_what_acts_inside_training_is_a_reason_to_run_alone() -> None:
    train, val = _loaders()
    trainer = L.Trainer(**QUIET, max_epochs=2)

    def reasons(module: nn.Module, *args: Any, on: Any = trainer) -> list[str]:
        return read_fit_call(on, module, *args).reasons

    assert reasons(TwoOptimizers(1e-3, 0.0), train) == ["it has 2 optimizers"]
    assert reasons(EpochHook(1e-3, 0.0), train) == ["its on_train_epoch_end runs inside training"]
    own = L.Trainer(**QUIET, max_epochs=2, callbacks=[OwnCallback()])
    assert reasons(_member(0, 1e-3, 0.0), train, on=own) == [
        "its callback OwnCallback acts during training"
    ]
    half = L.Trainer(**QUIET, max_epochs=2, precision="bf16-mixed")
    assert reasons(_member(0, 1e-3, 0.0), train, on=half) == [
        "its precision is bf16-mixed (fused: 32-true)"
    ]
    assert reasons(_member(0, 1e-3, 0.0), [train, val]) == [
        "its training data is a list, not one DataLoader"
    ]
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = {**QUIET, "enable_checkpointing": True}
    best = L.Trainer(**checkpoints, max_epochs=2, callbacks=[ModelCheckpoint(monitor="val_loss")])
    assert reasons(_member(0, 1e-3, 0.0), train, val, on=best) == [
        "its ModelCheckpoint keeps the best checkpoints by val_loss"
    ]
    # Lightning's own default one (the latest epoch's checkpoint) is no reason
    default = L.Trainer(**checkpoints, max_epochs=2)
    assert reasons(_member(0, 1e-3, 0.0), train, val, on=default) == []


def test_every_form_of_configure_optimizers_lightning_accepts_is_read() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    opt = torch.optim.Adam(params)
    step = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert read_optimizers(opt) == (opt, [], [])
    assert read_optimizers([opt]) == (opt, [], [])
    (got, plans, _) = read_optimizers(([opt], [step]))
    assert got is opt and plans == [SchedulerPlan(step)]
    config = {"scheduler": step, "interval": "step", "frequency": 2, "monitor": "val_loss"}
    for form in (
        {"optimizer": opt, "lr_scheduler": config},
        [{"optimizer": opt, "lr_scheduler": config}],
    ):
        assert read_optimizers(form) == (opt, [SchedulerPlan(step, "step", 2, "val_loss")], [])
    assert read_optimizers(None)[2] == ["it has no optimizer"]
    assert read_optimizers("adam")[2] == ["its configure_optimizers returned a str"]


def test_members_group_by_signature_evenly_and_each_one_left_alone_says_why() -> None:
    from furcate_hydra.fusion.grouping import Candidate, form_groups

    same = _signature(_member(0, 1e-3, 0.0))
    wider_batch = _signature(_member(1, 1e-3, 0.0), batch_size=32)
    candidates = [Candidate(f"job{i}", same) for i in range(5)]
    candidates.insert(2, Candidate("wide", wider_batch))
    candidates.append(
        Candidate("metric", None, ("MulticlassAccuracy updated inside training_step",))
    )
    grouping = form_groups(candidates, fuse_max=4)
    assert grouping.groups == [["job0", "job1", "job2"], ["job3", "job4"]]
    assert grouping.alone == {
        "wide": "its batch size differs",
        "metric": "MulticlassAccuracy updated inside training_step",
    }
    assert form_groups([Candidate("only", same)], fuse_max=8).alone == {
        "only": "no other config trains like it here"
    }
    with pytest.raises(ValueError, match="fuse_max=1"):
        form_groups(candidates, fuse_max=1)


def test_auto_picks_a_step_mode_on_a_batch_of_the_data_without_drawing_from_its_streams() -> None:
    shuffled = DataLoader(_loaders()[0].dataset, batch_size=16, shuffle=True)
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    members = [MemberTraining(m, m.configure_optimizers()) for m in fused]
    shape = TrainingShape.from_trainer(L.Trainer(**QUIET, max_epochs=2))
    torch.manual_seed(5)  # the order both runs draw from the global stream
    outcome = fused_fit(members, shape, shuffled, None, Recorder(len(CONFIGS)))
    assert outcome.step_mode in ("vmap", "loop")
    for i, (lr, wd) in enumerate(CONFIGS):
        alone = _member(i, lr, wd)
        torch.manual_seed(5)
        L.Trainer(**QUIET, max_epochs=2).fit(alone, shuffled)
        _assert_same_weights(fused[i], alone)


def _same_checkpoint(fused: dict[str, Any], alone: dict[str, Any]) -> None:
    assert fused.keys() == alone.keys()
    for key, value in alone.items():
        if key == "state_dict":
            for name, tensor in value.items():
                assert torch.equal(fused[key][name], tensor), name
        elif key == "optimizer_states":
            _state_equal(fused[key][0], value[0])
        else:
            assert fused[key] == value, key


@pytest.mark.parametrize(
    "trainer_kwargs",
    [{"max_epochs": 3}, {"max_epochs": 2, "accumulate_grad_batches": 4, "limit_train_batches": 5}],
)
def test_a_members_checkpoint_is_the_one_its_own_run_saves_and_it_resumes_alone(
    tmp_path: Path, trainer_kwargs: dict[str, Any]
) -> None:
    from furcate_hydra.fusion.member_checkpoint import lightning_checkpoint

    kw: dict[str, Any] = {"optimizer": "adamw", "scheduler": "step"}
    fused = [_member(i, lr, wd, **kw) for i, (lr, wd) in enumerate(CONFIGS)]
    train, val = _loaders()
    calls = [read_fit_call(L.Trainer(**QUIET, **trainer_kwargs), m, train, val) for m in fused]
    members = [call.member for call in calls if call.member is not None]
    assert calls[0].shape is not None
    outcome = fused_fit(members, calls[0].shape, train, val, Recorder(len(CONFIGS)))
    for i, (lr, wd) in enumerate(CONFIGS):
        written = lightning_checkpoint(members[i], outcome.progress[i], L.__version__)
        _, trainer = _alone(i, lr, wd, trainer_kwargs, **kw)
        trainer.save_checkpoint(tmp_path / "alone.ckpt")
        _same_checkpoint(written, torch.load(tmp_path / "alone.ckpt", weights_only=False))
    # member 1 resumes alone from its own checkpoint, two epochs further, as if never fused
    torch.save(
        lightning_checkpoint(members[1], outcome.progress[1], L.__version__), tmp_path / "m.ckpt"
    )
    further = {**trainer_kwargs, "max_epochs": trainer_kwargs["max_epochs"] + 2}
    resumed = _member(1, *CONFIGS[1], **kw)
    L.Trainer(**QUIET, **further).fit(resumed, train, val, ckpt_path=tmp_path / "m.ckpt")
    uninterrupted, _ = _alone(1, *CONFIGS[1], further, **kw)
    _assert_same_weights(resumed, uninterrupted)


class StopsAt(Recorder):
    """Records, and stops members at the epochs given, keeping their final metrics."""

    def __init__(self, count: int, stop_after_epoch: dict[int, int]) -> None:
        from furcate_hydra.fusion.final_metrics import FinalMetrics

        super().__init__(count, stop_after_epoch)
        self.final = FinalMetrics(count)

    def train_step(self, step: int, epoch: int, logs: Any, options: Any) -> None:
        self.final.train_step(step, epoch, logs, options)

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        self.final.validation_end(step, epoch, means)
        return self.final.stopped(super().validation_end(step, epoch, means), epoch)

    def train_epoch_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> None:
        self.final.train_epoch_end(step, epoch, means)


def test_each_members_final_metrics_are_its_own_runs_callback_metrics() -> None:
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(CONFIGS)]
    observer = StopsAt(len(CONFIGS), stop_after_epoch={2: 1})
    _fuse(fused, {"max_epochs": 3}, observer)
    for i, (lr, wd) in enumerate(CONFIGS):
        _, trainer = _alone(i, lr, wd, {"max_epochs": 2 if i == 2 else 3})
        expected = dict(trainer.callback_metrics)
        assert observer.final.metrics[i].keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(observer.final.metrics[i][name], value, msg=name)


def test_each_member_stops_early_where_its_own_early_stopping_stops_its_run() -> None:
    from lightning.pytorch.callbacks import EarlyStopping

    from furcate_hydra.fusion.member_stopping import MemberStopping

    def stopper() -> EarlyStopping:
        return EarlyStopping(monitor="val_loss", patience=1, min_delta=0.01)

    settings: dict[str, Any] = {"max_epochs": 12}
    lrs = [(3e-2, 0.0), (1e-2, 0.0), (3e-3, 0.0), (1e-1, 0.5)]
    fused = [_member(i, lr, wd) for i, (lr, wd) in enumerate(lrs)]
    train, val = _loaders()
    trainers: list[Any] = [L.Trainer(**QUIET, **settings, callbacks=[stopper()]) for _ in fused]
    calls = [read_fit_call(t, m, train, val) for t, m in zip(trainers, fused, strict=True)]
    assert all(call.fusable for call in calls), [call.reasons for call in calls]
    assert calls[0].shape is not None
    observer = MemberStopping([t.callbacks for t in trainers], calls[0].shape)
    members = [call.member for call in calls if call.member is not None]
    outcome = fused_fit(members, calls[0].shape, train, val, observer)
    stopped_early = 0
    for i, (lr, wd) in enumerate(lrs):
        own = stopper()
        alone = _member(i, lr, wd)
        trainer = L.Trainer(**QUIET, **settings, callbacks=[own])
        trainer.fit(alone, train, val)
        stopped_early += trainer.current_epoch < settings["max_epochs"]
        assert outcome.progress[i].epochs == trainer.current_epoch
        _assert_same_weights(fused[i], alone)
        mine = early_stopping_of(trainers[i])
        assert (mine.wait_count, mine.stopped_epoch) == (own.wait_count, own.stopped_epoch)
        # under vmap a logged loss can differ from its run's in the last bit (1-2 ulp: the
        # batched reduction), though the gradients and weights do not
        torch.testing.assert_close(mine.best_score, own.best_score)
    assert stopped_early >= 2  # the grid is one where early stopping acts


def early_stopping_of(trainer: Any) -> Any:
    from furcate_hydra.fusion.member_stopping import early_stopping_callbacks

    (found,) = early_stopping_callbacks(trainer.callbacks)
    return found


def test_reading_a_fit_call_probes_its_steps_without_drawing_from_any_random_stream() -> None:
    train, val = _loaders()
    generator = torch.Generator().manual_seed(3)
    shuffled = DataLoader(train.dataset, batch_size=16, shuffle=True, generator=generator)
    trainer = L.Trainer(**QUIET, max_epochs=2)
    module = _member(0, 1e-3, 0.0)
    before = torch.get_rng_state(), generator.get_state()
    assert read_fit_call(trainer, module, shuffled, val).fusable
    assert torch.equal(torch.get_rng_state(), before[0])
    assert torch.equal(generator.get_state(), before[1])
    assert read_fit_call(trainer, WithMetric(), train).reasons == [
        "MulticlassAccuracy updated inside training_step"
    ]
    assert read_fit_call(trainer, Branching(1e-3, 0.0), train).reasons == [
        "its training_step branches on a tensor's value"
    ]


class Named(TinyMLP):
    """Batches led by a list of names (strings): Lightning counts the first tensor's rows."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))


def test_an_epoch_mean_weighs_each_batch_by_its_first_tensors_rows_as_lightning_does() -> None:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 8, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    names = [f"sample{i}" for i in range(40)]
    samples = [(names[i], x[i], y[i]) for i in range(40)]
    train: DataLoader[Any] = DataLoader(samples, batch_size=16)  # type: ignore[arg-type]  # 16, 16 and 8 rows: unequal weights
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)
    configs = CONFIGS[:2]
    modules = []
    for i, config in enumerate(configs):
        torch.manual_seed(100 + i)
        modules.append(Named(*config))
    calls = [read_fit_call(L.Trainer(**QUIET, max_epochs=2), m, train, val) for m in modules]
    members = [call.member for call in calls if call.member is not None]
    assert calls[0].shape is not None and len(members) == 2
    observer = StopsAt(2, stop_after_epoch={})
    fused_fit(members, calls[0].shape, train, val, observer, step_mode="loop")
    for i, config in enumerate(configs):
        torch.manual_seed(100 + i)
        alone = Named(*config)
        trainer = L.Trainer(**QUIET, max_epochs=2)
        trainer.fit(alone, train, val)
        torch.testing.assert_close(
            observer.final.metrics[i]["train_loss_epoch"],
            trainer.callback_metrics["train_loss_epoch"],
        )
