"""An app with its own Trainer for fused trials: a tiny MLP on fixed data, written as users
write theirs (``import lightning as L``, ``trainer.fit``, code after it), nothing for furcate.

``module=metric`` updates a torchmetrics metric inside ``training_step`` (a reason not to fuse);
``early_stop=true`` adds an EarlyStopping callback; ``sample_sleep`` slows each training
sample; ``fit_delay`` seconds pass before fit (a config that reaches its group late). The
task saves the trained weights in its job dir (``weights.pt``) and returns the validation
loss of a ``trainer.validate`` after fit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import EarlyStopping
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy


class TinyMLP(L.LightningModule):
    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        h: Any = self.hparams
        return torch.optim.Adam(self.parameters(), lr=h.lr, weight_decay=h.weight_decay)


class WithMetric(TinyMLP):
    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__(lr, weight_decay)
        self.accuracy = MulticlassAccuracy(num_classes=3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.accuracy.update(logits, y)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
        return loss


class SlowData(TensorDataset):
    """Fixed samples, each read taking ``sleep`` seconds (a test stops a sweep mid-training)."""

    def __init__(self, sleep: float, *tensors: torch.Tensor) -> None:
        super().__init__(*tensors)
        self.sleep = sleep

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        time.sleep(self.sleep)
        return tuple(tensor[index] for tensor in self.tensors)


def loaders(batch_size: int, sleep: float) -> tuple[DataLoader[Any], DataLoader[Any]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=generator)
    # labels a linear rule gives (so validation improves, at each learning rate's pace)
    y = (x @ torch.randn(8, 3, generator=generator)).argmax(dim=1)
    train = DataLoader(SlowData(sleep, x[:64], y[:64]), batch_size=batch_size)
    return train, DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)


@hydra.main(version_base="1.3", config_path="conf", config_name="fused")
def main(cfg: DictConfig) -> Any:
    torch.manual_seed(int(cfg.seed))
    kind = {"mlp": TinyMLP, "metric": WithMetric}[cfg.module]
    model = kind(float(cfg.lr), float(cfg.weight_decay))
    callbacks: list[L.Callback] = (
        [EarlyStopping("val_loss", patience=1, min_delta=float(cfg.min_delta))]
        if cfg.early_stop
        else []
    )
    trainer = L.Trainer(
        max_epochs=int(cfg.epochs),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=2,
        callbacks=callbacks,
    )
    train, val = loaders(int(cfg.batch_size), float(cfg.sample_sleep))
    time.sleep(float(cfg.fit_delay))
    trainer.fit(model, train, val)
    # the app's own code after fit, run with this config's trained model
    torch.save(model.state_dict(), Path(HydraConfig.get().runtime.output_dir) / "weights.pt")
    (result,) = trainer.validate(model, val, verbose=False)
    return result["val_loss"]


if __name__ == "__main__":
    main()
