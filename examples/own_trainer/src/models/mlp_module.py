"""A classifier written as Lightning's docs write one: ``import lightning as L``."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn


class MLPClassifier(L.LightningModule):
    """Two linear layers with dropout (its random draws make an exact resume observable)."""

    def __init__(
        self,
        in_features: int = 16,
        hidden: int = 32,
        classes: int = 4,
        lr: float = 0.05,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.learning_rate: float = lr
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.learning_rate, momentum=0.9)
