"""Train a model of ~12 MB of checkpoint (weights and Adam's moments) with a checkpoint after
every step, for a test that SIGKILLs it in the middle of a write.

    python checkpoint_writer.py <root> <epochs>
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from furcate_hydra.lightning import JobEnv, fit

WIDTH = 1024


class Wide(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(root: Path, epochs: int) -> None:
    pl.seed_everything(0, verbose=False)
    x = torch.randn(64, WIDTH)
    loader = DataLoader(TensorDataset(x, x), batch_size=8, shuffle=True)
    fit(
        Wide(),
        train_dataloaders=loader,
        trainer_options={
            "max_epochs": epochs,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        env=JobEnv(root / "out", root / "checkpoints", checkpoint_every_n_steps=1),
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
