"""furcate's exclusion example: a grid of optimizers, learning rates and batch sizes, less the
combinations listed in ``hydra.sweeper.exclude`` (see conf/config.yaml).

Each job trains a small MLP on scikit-learn's bundled wine data (178 rows, no download) for a
couple of epochs and returns its validation accuracy; ``fit`` logs the metrics to the job's
MLflow run. Run the sweep with ``python exclusion_grid.py -m``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.lightning import JobEnv, fit

# The grid's names are torch.optim's class names, so each is looked up as written.
OPTIMIZERS: tuple[str, ...] = ("RMSprop", "SGD", "Adam", "NAdam", "Adadelta")

Loader = DataLoader[tuple[Tensor, ...]]


class WineClassifier(pl.LightningModule):
    """One hidden layer; the optimizer is picked by its torch.optim name."""

    def __init__(self, hidden_size: int, optimizer: str, learning_rate: float) -> None:
        super().__init__()
        # Fail while building, not after the first epoch when configure_optimizers runs.
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"Invalid optimizer={optimizer!r}: allowed are {', '.join(OPTIMIZERS)}."
            )
        self.save_hyperparameters()
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.net = nn.Sequential(nn.Linear(13, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 3))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
        self.log(f"{stage}_acc", acc, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        make: Callable[..., torch.optim.Optimizer] = getattr(torch.optim, self.optimizer_name)
        return make(self.parameters(), lr=self.learning_rate)


def wine_loaders(batch_size: int, val_fraction: float, seed: int) -> tuple[Loader, Loader]:
    """Stratified train/val split, standardised with the training rows' statistics."""
    bunch: Any = load_wine()
    x = np.asarray(bunch.data, dtype=np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=val_fraction, random_state=seed, stratify=y
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)

    def loader(features: Any, labels: Any, shuffle: bool) -> Loader:
        data = TensorDataset(torch.from_numpy((features - mean) / std), torch.from_numpy(labels))
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle)

    return loader(x_train, y_train, True), loader(x_val, y_val, False)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Train one config of the grid and return its validation accuracy."""
    # The data is a few in-memory tensors: loader workers would only add processes.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # verbose=False: the seed is in the job's config; "Seed set to 0" per job is noise
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    train, val = wine_loaders(int(cfg.batch_size), float(cfg.val_fraction), int(cfg.seed))
    model = WineClassifier(int(cfg.hidden_size), str(cfg.optimizer), float(cfg.learning_rate))
    result = fit(
        model,
        train_dataloaders=train,
        val_dataloaders=val,
        trainer_options={
            "max_epochs": int(cfg.epochs),
            # The launcher narrows CUDA_VISIBLE_DEVICES to the job's slot: "auto" uses it.
            "accelerator": str(cfg.accelerator),
            "devices": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "deterministic": True,
            "log_every_n_steps": 1,
        },
        env=JobEnv.from_environ(default_output_dir=Path(HydraConfig.get().runtime.output_dir)),
    )
    return result.metrics["val_acc"]


if __name__ == "__main__":
    main()
