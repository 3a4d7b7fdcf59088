"""The model and data of lightning_app.py, imported inside its task function: the launcher's
process never imports torch or Lightning, the fork server (which preloads them) does."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset


class SlowRegression(pl.LightningModule):
    def __init__(
        self, lr: float, epoch_sleep: float, log_path: Path, warning: str | None = None
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["log_path", "warning"])
        self.layer = nn.Linear(4, 1)
        self.lr = lr
        self.epoch_sleep = epoch_sleep
        self.log_path = log_path
        self.warning = warning  # warned by the first epoch: a user's warning amid training

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), on_epoch=True)

    def on_train_epoch_start(self) -> None:
        if self.warning is not None and self.current_epoch == 0:
            warnings.warn(self.warning, UserWarning, stacklevel=1)

    def on_train_epoch_end(self) -> None:
        with self.log_path.open("a") as handle:
            handle.write(json.dumps({"pid": os.getpid(), "epoch": self.current_epoch}) + "\n")
        time.sleep(self.epoch_sleep)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(seed: int) -> DataLoader[tuple[Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=8)
