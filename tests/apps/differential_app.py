"""A Lightning app written as users write theirs, for the differential suite
(``tests/test_same_as_alone.py``): its own ``Trainer``, ``import lightning as L``, CPU,
``deterministic=True``, a tiny classifier on data made here, Lightning's ``CSVLogger`` and
``ModelCheckpoint(save_last=True)`` in the job's output dir; nothing for furcate.

``row=<name>`` (``conf/differential/row/``) switches on one thing Lightning apps do (a shuffled
loader, a datamodule, a scheduler, manual optimization, ...) and ``variant=a|b`` picks one of
that row's two configs (the row's file says what they differ in). After fit the task writes
``weights.pt`` (the model's state_dict) and ``result.json`` (what it returns: the final
``val_loss``) into its output dir: under Hydra's basic launcher nothing else keeps the return.

While the file named by ``$DIFFERENTIAL_APP_SLOW_WHILE`` exists, each training or validation
sample takes 10 ms more: a test stops a sweep mid-training, deletes the file, and the same
command runs at full speed, with the same config.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR
from torch.utils.data import DataLoader, TensorDataset

SLOW_WHILE = "DIFFERENTIAL_APP_SLOW_WHILE"
FEATURES, CLASSES, SAMPLES, TRAIN_SAMPLES = 8, 3, 96, 64


class Samples(TensorDataset):
    """Fixed samples; slow while the marker file named by ``$DIFFERENTIAL_APP_SLOW_WHILE``
    exists."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        marker = os.environ.get(SLOW_WHILE)
        if marker and os.path.exists(marker):
            time.sleep(0.01)
        return tuple(tensor[index] for tensor in self.tensors)


def datasets() -> tuple[Samples, Samples]:
    """96 samples of 8 features, labelled by a linear rule into 3 classes: 64 to train on, 32
    to validate (a generator of their own: the app's seed is left to the model)."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=generator)).argmax(dim=1)
    return Samples(x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES]), Samples(
        x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:]
    )


def loaders(data: DictConfig) -> tuple[DataLoader[Any], DataLoader[Any]]:
    train, val = datasets()
    generator = None
    if data.generator_seed is not None:
        generator = torch.Generator().manual_seed(int(data.generator_seed))
    workers = int(data.num_workers)
    return (
        DataLoader(
            train,
            batch_size=int(data.batch_size),
            shuffle=bool(data.shuffle),
            generator=generator,
            num_workers=workers,
        ),
        DataLoader(val, batch_size=16, num_workers=workers),
    )


class SamplesData(L.LightningDataModule):
    """The same samples as a datamodule, its training loader shuffled."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = datasets()

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val_set, batch_size=16)


class Classifier(L.LightningModule):
    """A small MLP; ``model`` and ``optim`` (the config's sections) say which variation."""

    def __init__(self, model: dict[str, Any], optim: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters()
        hidden = int(model["hidden"])
        layers: list[nn.Module] = [nn.Linear(FEATURES, hidden)]
        if model["batchnorm"]:
            layers.append(nn.BatchNorm1d(hidden))
        layers.append(nn.Tanh())
        if model["dropout"]:
            layers.append(nn.Dropout(float(model["dropout"])))
        layers.append(nn.Linear(hidden, CLASSES))
        self.net = nn.Sequential(*layers)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=float(model["label_smoothing"]))
        if model["hold_lock"]:
            self.lock = threading.Lock()  # what many apps hold: a module that cannot be pickled
        self.automatic_optimization = optim["name"] != "two_manual"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss: torch.Tensor = self.criterion(logits, y)
        hparams: Any = self.hparams
        penalty = float(hparams.model["loss"]["weight"])
        if hparams.model["warmup"]:  # the penalty warmed up by where training is
            penalty *= min(1.0, (self.current_epoch + 1) / 4) * min(1.0, self.global_step / 10)
        if penalty:
            loss = loss + penalty * logits.pow(2).mean()
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        if not self.automatic_optimization:
            optimizers: Any = self.optimizers()
            first, second = optimizers
            first.zero_grad()
            second.zero_grad()
            self.manual_backward(loss)
            first.step()
            second.step()
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", self.criterion(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        hparams: Any = self.hparams
        optim = hparams.optim
        lr, decay = float(optim["lr"]), float(optim["weight_decay"])
        if optim["name"] == "two_manual":  # one for each layer, stepped in training_step
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=lr, momentum=0.9),
                torch.optim.Adam(self.net[-1].parameters(), lr=lr),
            ]
        optimizer: torch.optim.Optimizer
        if optim["name"] == "sgd_nesterov":
            optimizer = torch.optim.SGD(
                self.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=decay
            )
        elif optim["name"] == "adam_decoupled":  # AdamW's rule, in Adam
            optimizer = torch.optim.Adam(
                self.parameters(), lr=lr, weight_decay=decay, decoupled_weight_decay=True
            )
        else:
            optimizer = torch.optim.Adam(self.parameters(), lr=lr, weight_decay=decay)
        scheduler = optim["scheduler"]
        if scheduler is None:
            return optimizer
        if scheduler == "step":
            stepped = {"scheduler": StepLR(optimizer, step_size=3, gamma=0.5), "interval": "step"}
            return {"optimizer": optimizer, "lr_scheduler": stepped}
        if scheduler == "epoch":
            return {"optimizer": optimizer, "lr_scheduler": StepLR(optimizer, 1, gamma=0.7)}
        monitor = {"plateau_val": "val_loss", "plateau_train": "train_loss_epoch"}[scheduler]
        plateau = ReduceLROnPlateau(
            optimizer, factor=0.5, patience=0, threshold=0.1, threshold_mode="abs"
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": monitor}}


def section(node: DictConfig) -> dict[str, Any]:
    resolved: Any = OmegaConf.to_container(node, resolve=True)
    return dict(resolved)


@hydra.main(version_base="1.3", config_path="conf/differential", config_name="config")
def main(cfg: DictConfig) -> float:
    out = Path(HydraConfig.get().runtime.output_dir)
    torch.manual_seed(int(cfg.seed))
    model = Classifier(section(cfg.model), section(cfg.optim))
    callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=out / "checkpoints", save_last=True)]
    if cfg.early_stopping is not None:
        stop = cfg.early_stopping
        callbacks.append(
            EarlyStopping("val_loss", patience=int(stop.patience), min_delta=float(stop.min_delta))
        )
    t = cfg.trainer
    trainer = L.Trainer(
        max_epochs=int(cfg.epochs),
        accelerator="cpu",
        devices=1,
        deterministic=True,
        # every row written as it is logged: a sweep killed mid-training keeps what it logged
        logger=CSVLogger(out, name="csv", flush_logs_every_n_steps=1),
        callbacks=callbacks,
        log_every_n_steps=1,
        check_val_every_n_epoch=int(t.check_val_every_n_epoch),
        val_check_interval=t.val_check_interval,
        accumulate_grad_batches=int(t.accumulate_grad_batches),
        gradient_clip_val=t.gradient_clip_val,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if cfg.data.datamodule:
        trainer.fit(model, datamodule=SamplesData(int(cfg.data.batch_size)))
    else:
        train, val = loaders(cfg.data)
        trainer.fit(model, train, val)
    # the app's own code after fit, with this config's trained model
    torch.save(model.state_dict(), out / "weights.pt")
    result = float(trainer.callback_metrics["val_loss"])
    (out / "result.json").write_text(json.dumps({"val_loss": result}))
    return result


if __name__ == "__main__":
    main()
