"""A user's Lightning app on a fake GPU (``tests/fakes/nvml``): its own ``lightning`` Trainer,
training for ``seconds``, and ``gib`` of GPU memory held where the fake NVML reads it
(``held/<gpu>/<pid>``) for as long as it trains. Its steps/s are what ``jobs_per_gpu=auto``
measures. With ``capacity`` set, each step also waits as a time-sliced GPU would make it: the
GPU runs ``capacity`` jobs at full speed and shares that among more, so where one more job stops
paying does not depend on how busy this machine's cores are.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Wide(L.LightningModule):
    """Matrix products big enough that a step costs a core milliseconds."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class TimeSlicedGpu(L.Callback):
    """Each step takes ``step_s`` while the GPU holds at most ``capacity`` jobs, and in
    proportion beyond (the jobs holding memory on it are the ones running)."""

    def __init__(self, held: Path, capacity: int, step_s: float) -> None:
        self.held, self.capacity, self.step_s = held, capacity, step_s

    def on_train_batch_end(self, *args: Any) -> None:
        sharing = sum(1 for _ in self.held.iterdir())
        time.sleep(self.step_s * max(1.0, sharing / self.capacity))


@hydra.main(config_path="conf", config_name="fake_gpu_trainer", version_base=None)
def main(cfg: DictConfig) -> float:
    held = Path(os.environ["FURCATE_FAKE_NVML"]) / "held" / os.environ["CUDA_VISIBLE_DEVICES"]
    held.mkdir(parents=True, exist_ok=True)
    mine = held / str(os.getpid())
    mine.write_text(str(cfg.gib * 1024))
    try:
        torch.manual_seed(int(cfg.x))
        data = TensorDataset(torch.randn(2048, cfg.width), torch.randn(2048, 1))
        trainer = L.Trainer(
            accelerator="cpu",
            max_time={"seconds": int(cfg.seconds)},
            max_epochs=-1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            callbacks=[TimeSlicedGpu(held, cfg.capacity, cfg.step_s)] if cfg.capacity else [],
        )
        trainer.fit(Wide(cfg.width), DataLoader(data, batch_size=256))
        return float(trainer.global_step)
    finally:
        mine.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
