"""A model whose training draws random numbers everywhere, for the exact-resume tests.

Dropout draws from torch's generator in the job's process; the dataset adds noise from torch,
numpy and ``random`` each time a row is read (in a DataLoader worker when there are workers);
the DataLoader shuffles, as users write it. Each trained batch is appended to ``executed.jsonl``
(pid, epoch, batch, step), so a test can tell which batches each process trained.

Imported by tests in-process, and inside the task function of ``preempt_app.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from furcate_hydra.lightning import FitResult, JobEnv, fit

ROWS = 64
BATCH_SIZE = 8
BATCHES_PER_EPOCH = ROWS // BATCH_SIZE


class NoisyRows(Dataset[tuple[Tensor, Tensor]]):
    """Fixed rows, augmented with fresh noise from all three generators at every read."""

    def __init__(self, features: int = 4) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(ROWS, features, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        noise = 0.1 * torch.randn(self.x.shape[1]) + float(np.random.normal()) * 0.01
        return self.x[index] + noise + random.random() * 0.01, self.y[index]


class NoisyStream(IterableDataset[tuple[Tensor, Tensor]]):
    """The same rows as a stream, in an order drawn from torch's global stream at each pass
    (each of a loader's workers streams its share)."""

    def __iter__(self) -> Any:
        rows = NoisyRows()
        worker = get_worker_info()
        share = slice(None) if worker is None else slice(worker.id, None, worker.num_workers)
        for index in torch.randperm(ROWS).tolist()[share]:
            yield rows[index]


LOADERS = ("shuffled", "generator", "stream")


def loader(kind: str = "shuffled", workers: int = 0) -> DataLoader[Any]:
    """The training data as users write it: ``shuffled`` (shuffle=True, drawing from the global
    stream), ``generator`` (shuffled by a generator of the loader's own), ``stream`` (an
    IterableDataset)."""
    if kind == "stream":
        return DataLoader(NoisyStream(), batch_size=BATCH_SIZE, num_workers=workers)
    generator = torch.Generator().manual_seed(7) if kind == "generator" else None
    return DataLoader(
        NoisyRows(), BATCH_SIZE, shuffle=True, num_workers=workers, generator=generator
    )


class DropoutRegression(pl.LightningModule):
    """An MLP with dropout. ``signal_at``: at that global step, the process signals itself
    ``signum`` (mid-step, as a scheduler would); ``pause_s``: each step of the process's first
    attempt takes at least that long, so a test can signal it from outside mid-epoch."""

    def __init__(
        self,
        log_path: Path | None = None,
        signal_at: int | None = None,
        signum: int = signal.SIGTERM,
        pause_s: float = 0.0,
        hidden: int = 32,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(0.5), nn.Linear(hidden, 1)
        )
        self.log_path = log_path
        self.signal_at = signal_at
        self.signum = signum
        self.pause_s = pause_s

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.global_step == self.signal_at:
            os.kill(os.getpid(), self.signum)
        time.sleep(self.pause_s)
        if self.log_path is not None:
            row = {"pid": os.getpid(), "epoch": self.current_epoch, "batch": batch_idx}
            with self.log_path.open("a") as handle:
                handle.write(json.dumps({**row, "step": self.global_step}) + "\n")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def train(
    env: JobEnv,
    *,
    epochs: int = 3,
    workers: int = 0,
    data: str = "shuffled",
    model: dict[str, Any] | None = None,
    **trainer_options: Any,
) -> tuple[DropoutRegression, FitResult]:
    """Seed, build the model (``model``: its arguments), train deterministically on CPU with
    furcate's ``fit`` on the ``data`` kind of loader; return the model and fit's result."""
    pl.seed_everything(0, workers=True, verbose=False)
    torch.use_deterministic_algorithms(True)
    module = DropoutRegression(**(model or {}))
    result = fit(
        module,
        train_dataloaders=loader(data, workers),
        trainer_options=_trainer_options(epochs, trainer_options),
        env=env,
    )
    return module, result


def train_alone(
    root: Path, *, epochs: int = 3, workers: int = 0, data: str = "shuffled"
) -> DropoutRegression:
    """The same training as ``train`` with Lightning alone: no furcate anywhere."""
    pl.seed_everything(0, workers=True, verbose=False)
    torch.use_deterministic_algorithms(True)
    module = DropoutRegression()
    trainer = pl.Trainer(default_root_dir=root, **_trainer_options(epochs, {}))
    trainer.fit(module, train_dataloaders=loader(data, workers))
    return module


def _trainer_options(epochs: int, more: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_epochs": epochs,
        "accelerator": "cpu",
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": None,
        **more,
    }


def weights(model: nn.Module) -> dict[str, Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def weights_digest(model: nn.Module) -> str:
    """The sha256 of every weight's bytes, in name order: equal only if bitwise equal."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def executed(log_path: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in log_path.read_text().splitlines()]
