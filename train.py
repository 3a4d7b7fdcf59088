"""Reference app for furcate-hydra: an MLP on a scikit-learn bundled dataset.

Run one job with ``python train.py`` or a sweep with ``python train.py -m batch_size=32,64``.
The task function returns the final validation accuracy so Hydra sweepers can optimise it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import numpy.typing as npt
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.lightning import JobEnv, fit

log = logging.getLogger(__name__)

# Offline datasets only: sklearn ships these inside the package, so jobs never touch the network.
DATASETS: dict[str, Callable[..., Any]] = {
    "digits": load_digits,
    "breast_cancer": load_breast_cancer,
    "wine": load_wine,
}
OPTIMIZERS: tuple[str, ...] = ("Adam", "AdamW", "SGD", "Adadelta", "RMSprop")

Batch = tuple[Tensor, Tensor]


def _bad_choice(key: str, value: object, allowed: Sequence[str]) -> ValueError:
    """Build the error for a config value outside a fixed set of names."""
    return ValueError(f"Invalid {key}={value!r}: allowed values are {', '.join(allowed)}.")


@dataclass(frozen=True)
class SplitData:
    """Standardised train/val tensors plus what was used to make them."""

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    # Row indices into the raw dataset and the train-split statistics, kept so that
    # the preprocessing can be checked and reapplied to new data.
    train_index: npt.NDArray[np.int64]
    val_index: npt.NDArray[np.int64]
    mean: npt.NDArray[np.float64]
    std: npt.NDArray[np.float64]
    num_classes: int

    @property
    def num_features(self) -> int:
        """Width of one input row."""
        return int(self.x_train.shape[1])


def load_data(data_name: str, val_fraction: float, seed: int) -> SplitData:
    """Load a bundled dataset, split it stratified by class and standardise it.

    Mean and std come from the training rows only, so no validation information leaks
    into the features the model trains on.
    """
    if data_name not in DATASETS:
        raise _bad_choice("data_name", data_name, list(DATASETS))
    bunch = DATASETS[data_name]()
    features = np.asarray(bunch.data, dtype=np.float64)
    labels = np.asarray(bunch.target, dtype=np.int64)

    train_index, val_index = train_test_split(
        np.arange(len(labels), dtype=np.int64),
        test_size=val_fraction,
        random_state=seed,
        stratify=labels,
    )
    mean = features[train_index].mean(axis=0)
    std = features[train_index].std(axis=0)
    # Some digits pixels are always blank; dividing by 1 leaves them at 0 instead of NaN.
    std[std == 0.0] = 1.0

    def scaled(index: npt.NDArray[np.int64]) -> Tensor:
        return torch.from_numpy(((features[index] - mean) / std).astype(np.float32))

    return SplitData(
        x_train=scaled(train_index),
        y_train=torch.from_numpy(labels[train_index]),
        x_val=scaled(val_index),
        y_val=torch.from_numpy(labels[val_index]),
        train_index=train_index,
        val_index=val_index,
        mean=mean,
        std=std,
        num_classes=int(labels.max()) + 1,
    )


def build_dataloaders(
    data: SplitData, batch_size: int, num_workers: int
) -> tuple[DataLoader[tuple[Tensor, ...]], DataLoader[tuple[Tensor, ...]]]:
    """Wrap the split in train (shuffled) and val loaders."""

    def loader(x: Tensor, y: Tensor, shuffle: bool) -> DataLoader[tuple[Tensor, ...]]:
        # persistent_workers raises with num_workers=0; with workers it avoids re-forking
        # them every epoch.
        return DataLoader(
            TensorDataset(x, y),
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
        )

    return loader(data.x_train, data.y_train, True), loader(data.x_val, data.y_val, False)


class MLPClassifier(pl.LightningModule):
    """Fully connected classifier: Linear-ReLU-Dropout blocks then a Linear head."""

    def __init__(
        self,
        num_features: int,
        num_classes: int,
        hidden_sizes: Sequence[int],
        dropout: float,
        optimizer: str,
        learning_rate: float,
        weight_decay: float,
    ) -> None:
        super().__init__()
        # Fail while building, not after the first epoch when configure_optimizers runs.
        if optimizer not in OPTIMIZERS:
            raise _bad_choice("optimizer", optimizer, OPTIMIZERS)
        self.save_hyperparameters()
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay

        layers: list[nn.Module] = []
        width = num_features
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x: Tensor) -> Tensor:
        """Return class logits."""
        out: Tensor = self.net(x)
        return out

    def _step(self, batch: Batch, stage: str) -> Tensor:
        x, y = batch
        logits = self(x)
        loss: Tensor = self.loss_fn(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        # batch_size makes the epoch value a per-sample mean even when the last batch is short.
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
        self.log(f"{stage}_acc", acc, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """Log train_loss/train_acc and return the loss to minimise."""
        return self._step(batch, "train")

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Log val_loss/val_acc."""
        self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Instantiate the configured torch.optim class by name."""
        # Typed as a factory: the base Optimizer's __init__ does not declare lr/weight_decay.
        make: Callable[..., torch.optim.Optimizer] = getattr(torch.optim, self.optimizer_name)
        return make(self.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)


def build_model(cfg: DictConfig, data: SplitData) -> MLPClassifier:
    """Create the model sized for ``data`` from the config's model keys."""
    return MLPClassifier(
        num_features=data.num_features,
        num_classes=data.num_classes,
        hidden_sizes=[int(h) for h in cfg.hidden_sizes],
        dropout=float(cfg.dropout),
        optimizer=str(cfg.optimizer),
        learning_rate=float(cfg.learning_rate),
        weight_decay=float(cfg.weight_decay),
    )


def trainer_options(cfg: DictConfig) -> dict[str, Any]:
    """A quiet, deterministic single-device trainer; furcate adds logging and checkpoints."""
    return {
        "max_epochs": int(cfg.epochs),
        # The launcher narrows CUDA_VISIBLE_DEVICES to one slot, so "auto" + 1 device uses it.
        "accelerator": str(cfg.get("accelerator", "auto")),
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "deterministic": True,
        # An epoch is only a few dozen batches, so the default of 50 would never log a step.
        "log_every_n_steps": 1,
    }


def fit_and_evaluate(cfg: DictConfig, env: JobEnv | None = None) -> float:
    """Seed, train for ``cfg.epochs`` and return the last epoch's validation accuracy.

    Under the furcate launcher the metrics go to the job's MLflow run, a checkpoint is saved
    atomically after every epoch, and an interrupted job continues from its last one. Without
    it, the same files (history.json, plots, checkpoints) land in the working directory.
    """
    # verbose=False: the seed is in the config (and the job's last log line), so Lightning's
    # "Seed set to 0" would repeat it once per job of a sweep
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    data = load_data(str(cfg.data_name), float(cfg.val_fraction), int(cfg.seed))
    train_loader, val_loader = build_dataloaders(data, int(cfg.batch_size), int(cfg.num_workers))
    model = build_model(cfg, data)
    result = fit(
        model,
        train_dataloaders=train_loader,
        val_dataloaders=val_loader,
        trainer_options=trainer_options(cfg),
        env=env,
    )
    if result.resumed_from is not None:
        log.info("resumed at epoch %d from %s", result.resumed_at_epoch, result.resumed_from)
    val_acc = result.metrics.get("val_acc")
    if val_acc is None:
        raise RuntimeError("training finished without logging val_acc (was epochs >= 1?)")
    return float(val_acc)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra task function: train one configuration and return its val_acc."""
    # Data lives in memory as tensors, so loader workers would only add process overhead;
    # num_workers=0 is deliberate and Lightning's hint about it is noise here.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # Called directly (tests, notebooks) there is no Hydra run: files go to the working dir.
    output_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    env = JobEnv.from_environ(default_output_dir=output_dir)
    val_acc = fit_and_evaluate(cfg, env)
    log.info(
        "data_name=%s optimizer=%s learning_rate=%g weight_decay=%g batch_size=%d epochs=%d "
        "hidden_sizes=%s dropout=%g seed=%d -> val_acc=%.4f",
        cfg.data_name,
        cfg.optimizer,
        cfg.learning_rate,
        cfg.weight_decay,
        cfg.batch_size,
        cfg.epochs,
        list(cfg.hidden_sizes),
        cfg.dropout,
        cfg.seed,
        val_acc,
    )
    return val_acc


if __name__ == "__main__":
    main()
