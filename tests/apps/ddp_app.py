"""An app shaped like the most used Hydra + Lightning template: its Trainer from the ``trainer``
config group (``cpu``, ``ddp_sim``: Lightning's ``ddp_spawn`` on 2 CPU processes, ``ddp``: the
subprocess launcher that runs the script again for rank 1), built with ``hydra.utils
.instantiate``, a LightningModule of ``lightning``'s namespace, and the metric it returns.

Each rank appends what it saw to ``ranks.jsonl`` in the job dir (its rank, pid, the job's
MLflow run, the step it starts training at, the width of the model it built), so a test can
tell the ranks of one job from those of another, where each resumed, and which config each
composed (``-cn wide``: the app's second primary config). The job returns its validation loss
and its final weights (rank 0's, which ``ddp_spawn`` hands back to the job's process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(
        self, lr: float, epoch_sleep: float = 0.0, fail_rank: int | None = None, width: int = 16
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.epoch_sleep, self.fail_rank = lr, epoch_sleep, fail_rank
        self.net = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.epoch_sleep:
            import time

            time.sleep(self.epoch_sleep / self.trainer.num_training_batches)
        if self.global_rank == self.fail_rank and self.current_epoch == 1:
            raise RuntimeError(f"rank {self.global_rank} fails in epoch 1, as asked")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_train_start(self) -> None:
        out = Path(os.environ.get("FURCATE_OUTPUT_DIR", os.getcwd()))
        seen = {
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "pid": os.getpid(),
            "run_id": os.environ.get("MLFLOW_RUN_ID"),
            "global_step": self.trainer.global_step,
            "epoch": self.current_epoch,
            "width": self.net[0].out_features,
        }
        with (out / "ranks.jsonl").open("a") as file:
            file.write(json.dumps(seen) + "\n")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(seed: int, shuffle: bool = False) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=shuffle)


@hydra.main(version_base="1.3", config_path="conf/ddp", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | float:
    L.seed_everything(int(cfg.seed), workers=True)
    trainer: L.Trainer = instantiate(cfg.trainer)
    model = Regression(float(cfg.lr), float(cfg.epoch_sleep), cfg.fail_rank, int(cfg.width))
    trainer.fit(model, loader(0, bool(cfg.shuffle)), loader(1))
    if trainer.is_global_zero:  # the weights it ended on, for a test to compare bitwise
        out = Path(os.environ.get("FURCATE_OUTPUT_DIR", os.getcwd()))
        torch.save(model.state_dict(), out / "weights.pt")
    val_loss = float(trainer.callback_metrics["val_loss"])
    if cfg.returns == "val_loss":  # an Optuna objective
        return val_loss
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"val_loss": val_loss, "weights": weights.tolist()}


if __name__ == "__main__":
    main()
