"""A tiny Lightning task for resume tests: slow epochs, and a log of which epochs each process ran.

``epoch_sleep`` stretches every epoch so a test can interrupt a job mid-training. Each
executed epoch is appended to ``executed.jsonl`` in the run's checkpoint dir (which survives
a relaunch), so a test can tell a resumed job from one that started over.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.lightning import JobEnv, fit


class SlowRegression(pl.LightningModule):
    def __init__(self, lr: float, epoch_sleep: float, log_path: Path) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["log_path"])
        self.layer = nn.Linear(4, 1)
        self.lr = lr
        self.epoch_sleep = epoch_sleep
        self.log_path = log_path

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), on_epoch=True)

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


@hydra.main(version_base="1.3", config_path="conf", config_name="lightning")
def main(cfg: DictConfig) -> Any:
    env = JobEnv.from_environ(default_output_dir=Path(HydraConfig.get().runtime.output_dir))
    env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    model = SlowRegression(
        float(cfg.lr), float(cfg.epoch_sleep), env.checkpoint_dir / "executed.jsonl"
    )
    result = fit(
        model,
        train_dataloaders=loader(0),
        val_dataloaders=loader(1),
        trainer_options={
            "max_epochs": int(cfg.epochs),
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
        },
        env=env,
    )
    return {"val_loss": result.metrics["val_loss"], "epochs": result.epochs_completed}


if __name__ == "__main__":
    main()
