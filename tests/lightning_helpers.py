"""The tiny Lightning model, data and fit shared by the ``test_lightning_*`` modules.

Imported inside the tests that train (it imports torch and Lightning), so collecting the suite
and running the tests that do not train never pays for those imports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.lightning import FitResult, JobEnv, fit

BATCHES_PER_EPOCH = 4
OPTIONS: dict[str, Any] = {
    "accelerator": "cpu",
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


class TinyModule(pl.LightningModule):
    """One linear layer; records which epochs it trained, logs an epoch metric in its hook."""

    def __init__(self, learning_rate: float = 0.05, hidden: int = 8, tag: str = "tiny") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)
        self.learning_rate = learning_rate
        self.epochs_run: list[int] = []
        self.fail_at_epoch: int | None = None

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.current_epoch == self.fail_at_epoch:
            raise RuntimeError("planned failure")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def on_train_epoch_start(self) -> None:
        self.epochs_run.append(self.current_epoch)

    def on_train_epoch_end(self) -> None:
        # logged after the plain callbacks ran: MetricsHistory must still see it this epoch
        self.log("epoch_marker", float(self.current_epoch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.learning_rate)


class Loaders(TypedDict):
    train_dataloaders: DataLoader[tuple[torch.Tensor, ...]]
    val_dataloaders: DataLoader[tuple[torch.Tensor, ...]]


def loaders() -> Loaders:
    """32 random rows: four training batches and two validation batches per epoch."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randn(32, 1))
    return {
        "train_dataloaders": DataLoader(data, batch_size=32 // BATCHES_PER_EPOCH),
        "val_dataloaders": DataLoader(data, batch_size=16),
    }


def run_fit(
    env: JobEnv, max_epochs: int, model: TinyModule | None = None, **options: Any
) -> tuple[TinyModule, FitResult]:
    model = model or TinyModule()
    result = fit(
        model,
        **loaders(),
        trainer_options={**OPTIONS, "max_epochs": max_epochs, **options},
        env=env,
    )
    return model, result


def standalone_env(root: Path, checkpoint_dir: Path | None = None) -> JobEnv:
    out = root / "out"
    return JobEnv(out, checkpoint_dir or out / "checkpoints")


def history_epochs(path: Path) -> list[int]:
    return [row["epoch"] for row in json.loads(path.read_text())]
