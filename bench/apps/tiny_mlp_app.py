"""A Hydra app for the fused-sweep benchmark: a tiny MLP on fixed data, with its own Trainer,
as users write theirs (``import lightning as L``); one config per (lr, weight_decay). It
writes ``result.json`` (its validation loss) into its job dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyMLP(L.LightningModule):
    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        h: Any = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=h.lr, weight_decay=h.weight_decay)


@hydra.main(version_base="1.3", config_path="conf", config_name="tiny_mlp")
def main(cfg: DictConfig) -> float:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(int(cfg.samples) + 256, 32, generator=generator)
    y = torch.randint(0, 10, (len(x),), generator=generator)
    n = int(cfg.samples)
    train = DataLoader(TensorDataset(x[:n], y[:n]), batch_size=int(cfg.batch_size))
    val = DataLoader(TensorDataset(x[n:], y[n:]), batch_size=256)
    torch.manual_seed(int(cfg.seed))
    model = TinyMLP(float(cfg.lr), float(cfg.weight_decay))
    trainer = L.Trainer(
        max_epochs=int(cfg.epochs),
        accelerator=str(cfg.accelerator),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(model, train, val)
    val_loss = float(trainer.callback_metrics["val_loss"])
    out = Path(HydraConfig.get().runtime.output_dir) / "result.json"
    out.write_text(json.dumps({"val_loss": val_loss}))
    return val_loss


if __name__ == "__main__":
    main()
