"""What a step checkpoint costs: ms per save, and its share of training time at the cadence.

Two models train on CPU through ``furcate_hydra.lightning.fit``, as a job does:

  reference   train.py's MLPClassifier on digits (hidden [64], Adam, batch 64): 4.8k weights
  100 MB      the same classifier with hidden [5000, 5000]: 25.3M weights (101 MB), Adam (its
              two moments make the checkpoint ~3 x the weights)

For each, a fit that saves after every step (``checkpoint_every_n_steps=1``) times each
``AtomicCheckpoint.save`` and its parts: Lightning's ``save_checkpoint`` to the temporary file,
the sha256 and fsync of it, and the rest (rename, directory fsync, ``last.json``, pruning). The
same fit without step checkpoints gives the time per training step: the anchor.

Shares: a save every ``checkpoint_every_s`` seconds (the default, 300) takes save / (300 s +
save) of a job's wall time; every 100 steps, save / (100 x step + save).

Run: ``python bench/checkpoint_cost.py`` (~2 min) writes bench/results/checkpoint_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from bench.harness import OthersCpu, machine, publish, summarize
from furcate_hydra.lightning import JobEnv, fit
from furcate_hydra.lightning import _checkpoint as checkpoint_module
from furcate_hydra.lightning._checkpoint import AtomicCheckpoint
from hydra_plugins.furcate_launcher.config import FurcateLauncherConf
from train import MLPClassifier, build_dataloaders, load_data

MODELS = {"reference": [64], "100MB": [5000, 5000]}
EVERY_N_STEPS = 100


class StepTimes(pl.Callback):
    """Wall time of each training step (batch start to batch end)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._began = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._began = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seconds.append(time.perf_counter() - self._began)


@contextmanager
def timed_saves() -> Iterator[dict[str, list[float]]]:
    """Time every AtomicCheckpoint.save, and within it Lightning's write and the hashing."""
    parts: dict[str, list[float]] = {"save": [], "write": [], "sha256_fsync": []}
    # the module imports sha256_of by name: time it where the module looks it up
    names = vars(checkpoint_module)
    save, sha = AtomicCheckpoint.save, names["sha256_of"]

    def timing(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                parts[name].append(time.perf_counter() - began)

        return wrapped

    def save_timed(self: AtomicCheckpoint, trainer: pl.Trainer, batch: int | None = None) -> Path:
        write = trainer.save_checkpoint
        trainer.save_checkpoint = timing("write", write)  # type: ignore[method-assign]
        try:
            path: Path = timing("save", save)(self, trainer, batch)
            return path
        finally:
            trainer.save_checkpoint = write  # type: ignore[method-assign]

    AtomicCheckpoint.save = save_timed  # type: ignore[method-assign]
    names["sha256_of"] = timing("sha256_fsync", sha)
    try:
        yield parts
    finally:
        AtomicCheckpoint.save = save  # type: ignore[method-assign]
        names["sha256_of"] = sha


def train(hidden: list[int], steps: int, every_step: bool, root: Path) -> StepTimes:
    pl.seed_everything(0, verbose=False)
    data = load_data("digits", 0.2, 0)
    train_loader, _ = build_dataloaders(data, batch_size=64, num_workers=0)
    model = MLPClassifier(data.num_features, data.num_classes, hidden, 0.0, "Adam", 1e-3, 0.0)
    times = StepTimes()
    fit(
        model,
        train_dataloaders=train_loader,
        trainer_options={
            "max_steps": steps,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [times],
        },
        env=JobEnv(root, root / "checkpoints", checkpoint_every_n_steps=1 if every_step else None),
    )
    return times


def measure(name: str, hidden: list[int], saves: int) -> dict[str, Any]:
    print(f"{name}: {saves} steps without, then with a checkpoint after each", flush=True)
    with tempfile.TemporaryDirectory(prefix="furcate-ckpt-") as tmp:
        plain = train(hidden, saves, False, Path(tmp) / "plain")
        with timed_saves() as parts:
            train(hidden, saves, True, Path(tmp) / "saving")
        newest = max(
            (Path(tmp) / "saving" / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime
        )
        size_mb = newest.stat().st_size / 1e6
    # the first step warms up (allocations, first optimizer state): left out
    step_s = statistics.median(plain.seconds[1:])
    save_s = statistics.median(parts["save"])
    default_every_s = FurcateLauncherConf().checkpoint_every_s
    assert default_every_s is not None, "the launcher has a default time cadence"
    default_s = float(default_every_s)
    return {
        "weights": sum(
            p.numel() for p in MLPClassifier(64, 10, hidden, 0.0, "Adam", 1e-3, 0.0).parameters()
        ),
        "checkpoint_mb": round(size_mb, 1),
        "step": summarize(plain.seconds[1:]),
        "save": summarize(parts["save"]),
        "write": summarize(parts["write"]),
        "sha256_fsync": summarize(parts["sha256_fsync"]),
        "save_over_step": round(save_s / step_s, 1),
        "share_at_default_every_s": round(save_s / (default_s + save_s), 6),
        "default_every_s": default_s,
        f"share_every_{EVERY_N_STEPS}_steps": round(save_s / (EVERY_N_STEPS * step_s + save_s), 4),
    }


def show(figures: dict[str, Any]) -> None:
    print(
        f"\n{'model':<10} {'ckpt MB':>8} {'step ms':>8} {'save ms':>8} {'write':>7} "
        f"{'sha+fsync':>9} {'@300 s':>8} {'@100 steps':>10}"
    )
    for name in MODELS:
        f = figures[name]
        print(
            f"{name:<10} {f['checkpoint_mb']:>8} {f['step']['median_ms']:>8} "
            f"{f['save']['median_ms']:>8} {f['write']['median_ms']:>7} "
            f"{f['sha256_fsync']['median_ms']:>9} {f['share_at_default_every_s']:>8.4%} "
            f"{f[f'share_every_{EVERY_N_STEPS}_steps']:>10.2%}"
        )
    print(f"others' CPU share: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=30, help="saves of the reference model")
    parser.add_argument("--big-saves", type=int, default=10, help="saves of the 100 MB model")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a job on one CPU slot of this machine
    at_start = machine()
    others, cpu = OthersCpu(), time.process_time()
    figures: dict[str, Any] = {
        "reference": measure("reference", MODELS["reference"], args.saves),
        "100MB": measure("100MB", MODELS["100MB"], args.big_saves),
    }
    figures["others_cpu_share"] = others.share(time.process_time() - cpu)
    publish("checkpoint_cost", at_start, figures, show)


if __name__ == "__main__":
    main()
