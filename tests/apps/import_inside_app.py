"""A Hydra app that imports torch and Lightning inside its main function, as many do to keep
``--help`` and ``--cfg`` quick: the launcher's process never imports them.

Each job writes ``warm.json`` into its output dir: whether torch and Lightning were imported
already when its task began (inherited from the fork server). It then trains a tiny model one
epoch, holds for ``+hold_s`` seconds and returns its last loss.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg: DictConfig) -> float:
    warm = {name: name in sys.modules for name in ("torch", "lightning")}
    Path(HydraConfig.get().runtime.output_dir, "warm.json").write_text(json.dumps(warm))
    import lightning as L
    import torch

    class Line(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(int(cfg.get("i", 0)))
    x = torch.rand(16, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, 2 * x), batch_size=8)
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(Line(), data)
    time.sleep(float(cfg.get("hold_s", 0)))
    return float(trainer.callback_metrics["train_loss"])


if __name__ == "__main__":
    main()
