"""A DDP app (``strategy=ddp``, 2 ranks on CPU with gloo, its own Trainer) that says how each
rank started: whether torch was loaded before this script ran (a rank forked warm from its
job's process) or not (a new interpreter), its parent, where it imported its own module, and
how many MLflow clients it built. Each rank appends that to ``ranks.jsonl`` in the job dir at
``on_train_start``, with the time; rank 0 saves its final weights to ``weights.pt``.

It registers an OmegaConf resolver at its import (``${twice:8}`` in its config), as many apps
do: a rank that imports it again must be able to.
"""

from __future__ import annotations

import sys

TORCH_BEFORE = "torch" in sys.modules  # first: what this process had before this script

import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

# a module of the app's own, beside it (found on sys.path[0], the script's dir)
PARTS = importlib.import_module("warm_rank_parts")
OmegaConf.register_new_resolver("twice", lambda x: 2 * int(x))

BUILT = [0]  # MLflow clients built in this process since this script ran
_build = MlflowClient.__init__


def _counted(self: MlflowClient, *args: Any, **kwargs: Any) -> None:
    BUILT[0] += 1
    _build(self, *args, **kwargs)


MlflowClient.__init__ = _counted  # type: ignore[method-assign]


class Regression(L.LightningModule):
    def __init__(self, lr: float, width: int, entered: float) -> None:
        super().__init__()
        self.lr, self.entered = lr, entered
        self.net = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def on_train_start(self) -> None:
        seen = {
            "rank": self.global_rank,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "torch_before": TORCH_BEFORE,
            "parts_imported_in": PARTS.IMPORTED_IN,
            "mlflow_clients_built": BUILT[0],
            "entered": self.entered,
            "train_start": time.time(),
        }
        with (Path(os.environ.get("FURCATE_OUTPUT_DIR", os.getcwd())) / "ranks.jsonl").open(
            "a"
        ) as file:
            file.write(json.dumps(seen) + "\n")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@hydra.main(version_base="1.3", config_path="conf/warm_ranks", config_name="config")
def main(cfg: DictConfig) -> float:
    entered = time.time()
    if cfg.before_fit == "parallel_op":  # OpenMP's worker threads start in this process
        torch.set_num_threads(2)
        torch.ones(1_000_000).mul(2)
    L.seed_everything(int(cfg.seed))
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=int(cfg.epochs),
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    model = Regression(float(cfg.lr), int(cfg.width), entered)
    trainer.fit(model, data)
    if trainer.is_global_zero:
        out = Path(os.environ.get("FURCATE_OUTPUT_DIR", os.getcwd()))
        torch.save(model.state_dict(), out / "weights.pt")
    return float(trainer.callback_metrics["train_loss"])


if __name__ == "__main__":
    main()
