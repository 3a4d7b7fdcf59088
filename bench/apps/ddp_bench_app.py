"""A DDP job for ``bench/ddp_start.py``: a small regression model trained by a Trainer of the
app's own, ``strategy`` ``ddp`` (ranks 1..N-1 a new run of this script) or ``ddp_spawn``, on
CPU with gloo, for ``epochs`` short epochs.

Each process appends to ``ranks.jsonl`` in its Hydra output dir (``FURCATE_OUTPUT_DIR`` under
furcate, where every rank writes into its job's dir) when it entered the task, when its
training started and ended, with its rank; under Hydra's basic launcher a ``ddp`` rank 1
replays the sweep from its own process and writes into the dirs its replay makes, keyed by
``lr`` so the bench can match it to its job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class _Times(L.Callback):
    def __init__(self, out: Path, lr: float, entered: float) -> None:
        self.out, self.lr, self.entered = out, lr, entered

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = time.time()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        row = {
            "rank": trainer.global_rank,
            "lr": self.lr,
            "entered": self.entered,
            "train_start": self.started,
            "train_end": time.time(),
            "pid": os.getpid(),
        }
        with (self.out / "ranks.jsonl").open("a") as file:
            file.write(json.dumps(row) + "\n")


class _Regression(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@hydra.main(version_base="1.3", config_path="conf", config_name="ddp_bench")
def main(cfg: DictConfig) -> float:
    entered = time.time()
    out = Path(os.environ.get("FURCATE_OUTPUT_DIR") or HydraConfig.get().runtime.output_dir)
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=str(cfg.strategy),
        max_epochs=int(cfg.epochs),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[_Times(out, float(cfg.lr), entered)],
    )
    trainer.fit(_Regression(float(cfg.lr)), data)
    return float(cfg.lr)


if __name__ == "__main__":
    main()
