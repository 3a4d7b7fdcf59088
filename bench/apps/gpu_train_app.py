"""A Hydra app for the GPU packing bench: a job trains a small Lightning model on synthetic data
for ``train_seconds`` and writes ``bench.json`` into its output dir.

    model=mlp  an MLP, batches of 512 vectors (a job that leaves most of an H100 idle)
    model=cnn  a small CNN, batches of 256 images of 3x32x32
    model=oom  the MLP, which after ``oom_after_s`` s of training takes a block of
               ``oom_fraction`` of the GPU's total memory and holds it to its end: at 1/6, 5
               jobs fit on a GPU and 8 do not. Its memory grows late on purpose:
               ``jobs_per_gpu=auto`` learns the small peak first and opens slots, then the
               jobs outgrow them and it has to back off

Batches are drawn on the job's device from a generator seeded by ``seed``, so no data loading
competes for the CPU. Three optional keys, given as ``+key=value`` by the bench:

    barrier=K, barrier_dir=D  after its first step a job leaves a file in D and trains on,
                              untimed, until K jobs have (or ``barrier_timeout_s``): the timed
                              seconds then start with all K jobs training
    stop_at=EPOCH             the case's deadline: training stops there, and a job that starts
                              after it returns at once without touching the GPU ("cut")

``bench.json``: samples trained in the timed seconds (after the barrier, the GPU synchronised:
the job's start-up is left out) and their rate; every step's samples in wall-clock buckets of
``BUCKET_S`` (the bench adds the jobs' buckets up into the GPU's aggregate rate);
``torch.cuda.max_memory_reserved()`` in MiB, the device and torch's version. Each attempt of a
job also appends its start and its end ("ok" or "oom") to ``attempts.jsonl`` there, so a job
run again after a CUDA out-of-memory error shows both attempts. ``tiny=true`` shrinks every
size for a CPU run. Torch and Lightning are imported with the module: the launcher's process
imports them once, and the fork server, a fork of it, has them for every job.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset

from bench.sweep_reading import record_attempt

try:
    import lightning.pytorch as pl
except ImportError:  # only the older package name installed
    import pytorch_lightning as pl  # type: ignore[no-redef]

CLASSES = 10
MIB = 1 << 20
BUCKET_S = 0.25  # the wall-clock buckets of every step's samples
LOOK_EVERY_S = 0.02  # how often a job waiting at the barrier counts the arrivals


class Steps(IterableDataset[int]):
    """Step numbers without end: the model draws each batch itself, on its device."""

    def __iter__(self) -> Iterator[int]:
        step = 0
        while True:
            yield step
            step += 1


class Synthetic(pl.LightningModule):
    """Classifies random inputs by the labels a fixed random linear teacher gives them."""

    def __init__(self, net: nn.Module, shape: tuple[int, ...], batch_size: int, seed: int):
        super().__init__()
        self.net = net
        self.shape = shape
        self.batch_size = batch_size
        self.seed = seed
        self.teacher = nn.Linear(math.prod(shape), CLASSES).requires_grad_(False)
        self.generator: torch.Generator | None = None

    def on_train_start(self) -> None:
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        size = (self.batch_size, *self.shape)
        x = torch.randn(size, device=self.device, generator=self.generator)
        with torch.no_grad():
            y = self.teacher(x.flatten(1)).argmax(dim=1)
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.net.parameters(), lr=1e-3)


class Barrier:
    """Where the case's jobs meet: one file each in ``folder``; passed once ``parties`` are
    there or ``timeout_s`` after this job's arrival (a job that never comes cannot hang it)."""

    def __init__(self, folder: Path, parties: int, timeout_s: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()
        self.folder = folder
        self.parties = parties
        self.deadline = time.time() + timeout_s
        self.met: bool | None = None
        self._next_look = 0.0

    def passed(self, now: float) -> bool:
        if now < self._next_look:
            return False
        self._next_look = now + LOOK_EVERY_S
        if len(os.listdir(self.folder)) >= self.parties:
            self.met = True
        elif now >= self.deadline:
            self.met = False
        return self.met is not None


class Budget(pl.Callback):
    """Times ``seconds`` of training from the barrier (from the first step without one) and
    stops there or at ``stop_at``; counts every step's samples in wall-clock buckets."""

    def __init__(
        self, seconds: float, batch_size: int, stop_at: float, meet: Callable[[], Barrier] | None
    ) -> None:
        self.seconds = seconds
        self.batch_size = batch_size
        self.stop_at = stop_at
        self.meet = meet
        self.barrier: Barrier | None = None
        self.timing = False
        self.steps = 0
        self.began = self.ended = 0.0  # wall clock, to compare jobs in one sweep
        self.buckets: Counter[int] = Counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        now = time.time()
        self.buckets[int(now / BUCKET_S)] += self.batch_size
        if now >= self.stop_at:
            trainer.should_stop = True
        if self.timing:
            self.steps += 1
            if now - self.began >= self.seconds:
                trainer.should_stop = True
            return
        if self.meet is not None and self.barrier is None:
            self.barrier = self.meet()  # after the first step: CUDA and the model are warm
        if self.barrier is None or self.barrier.passed(now):
            _synchronize()
            self.began, self.timing = time.time(), True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _synchronize()
        self.ended = time.time()
        if not self.timing:
            self.began = self.ended  # stopped at the deadline before the barrier: nothing timed


class BlockAfter(pl.Callback):
    """After ``seconds`` of training, takes ``fraction`` of the GPU's memory until the end."""

    def __init__(self, seconds: float, fraction: float) -> None:
        self.seconds = seconds
        self.fraction = fraction
        self.began = 0.0
        self.block: Tensor | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.began = time.time()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.block is None and time.time() - self.began >= self.seconds:
            self.block = hold_block(self.fraction)


def build(model: str, tiny: bool, seed: int) -> Synthetic:
    """The model ``model`` names, at full size or (``tiny``) small enough for a CPU."""
    if model in ("mlp", "oom"):
        width, features = (64, 32) if tiny else (1024, 256)
        net = nn.Sequential(
            nn.Linear(features, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, CLASSES),
        )
        return Synthetic(net, (features,), 32 if tiny else 512, seed)
    if model == "cnn":
        side, c = (8, 4) if tiny else (32, 32)
        net = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * c, 4 * c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(4 * c * (side // 4) ** 2, CLASSES),
        )
        return Synthetic(net, (3, side, side), 16 if tiny else 256, seed)
    raise ValueError(f"model must be mlp, cnn or oom, but got {model=}")


def hold_block(fraction: float) -> Tensor:
    """``fraction`` of the GPU's total memory, allocated and written (1 MiB without CUDA)."""
    if not torch.cuda.is_available():
        return torch.ones(MIB, dtype=torch.uint8)
    size = int(torch.cuda.get_device_properties(0).total_memory * fraction)
    return torch.empty(size, dtype=torch.uint8, device="cuda").fill_(1)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def budget_for(cfg: DictConfig, batch_size: int) -> Budget:
    """The job's timing from its config: train_seconds, and the optional barrier and stop_at."""
    parties = int(cfg.get("barrier", 0))
    meet = None
    if parties > 1:
        folder = Path(str(cfg.barrier_dir))
        timeout = float(cfg.get("barrier_timeout_s", 20.0))
        meet = partial(Barrier, folder, parties, timeout)
    stop_at = float(cfg.get("stop_at", 0)) or math.inf
    return Budget(float(cfg.train_seconds), batch_size, stop_at, meet)


def train(cfg: DictConfig) -> dict[str, Any]:
    torch.manual_seed(int(cfg.seed))
    torch.set_float32_matmul_precision("high")
    model = build(str(cfg.model), bool(cfg.tiny), int(cfg.seed))
    budget = budget_for(cfg, model.batch_size)
    grow = BlockAfter(float(cfg.oom_after_s), float(cfg.oom_fraction))
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    trainer = pl.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=1,
        max_epochs=1,
        max_steps=int(cfg.max_steps),
        callbacks=[budget, grow] if cfg.model == "oom" else [budget],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=DataLoader(Steps(), batch_size=None))
    seconds = budget.ended - budget.began
    samples = budget.steps * model.batch_size
    cuda = torch.cuda.is_available()
    return {
        "model": str(cfg.model),
        "seed": int(cfg.seed),
        "steps": budget.steps,
        "samples": samples,
        "train_began": budget.began,
        "train_ended": budget.ended,
        "train_seconds": round(seconds, 4),
        "samples_per_s": round(samples / seconds, 2) if seconds > 0 else None,
        "barrier_met": None if budget.barrier is None else budget.barrier.met,
        "bucket_s": BUCKET_S,
        "buckets": {str(b): n for b, n in sorted(budget.buckets.items())},
        "max_memory_reserved_mib": round(torch.cuda.max_memory_reserved() / MIB, 1)
        if cuda
        else None,
        "block_mib": None if grow.block is None else round(grow.block.numel() / MIB, 1),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        "slot": os.environ.get("FURCATE_SLOT"),
    }


@hydra.main(version_base="1.3", config_path="conf", config_name="gpu_train")
def main(cfg: DictConfig) -> dict[str, Any]:
    out = Path(HydraConfig.get().runtime.output_dir)
    started = time.time()
    if started >= float(cfg.get("stop_at", 0) or math.inf):
        info: dict[str, Any] = {"model": str(cfg.model), "seed": int(cfg.seed), "cut": True}
    else:
        try:
            info = train(cfg)
        except torch.cuda.OutOfMemoryError:
            record_attempt(out, started, "oom")
            raise  # as a user's job fails: the launcher decides what follows
        record_attempt(out, started, "ok")
    (out / "bench.json.tmp").write_text(json.dumps(info, indent=2))
    (out / "bench.json.tmp").replace(out / "bench.json")
    return info


if __name__ == "__main__":
    main()
