"""Fused training against one Lightning fit per config, in one process on one core.

The fused loop (``furcate_hydra.fusion``) trains N configs (a grid of lr x weight decay) of
one small model as one vmapped model; the anchor trains the same N configs one Lightning
``Trainer.fit`` after another in one process, with the same data and epochs: what a slot
does for N jobs, less the per-process cost (a fork, the job's MLflow run, Hydra's set-up),
which the launcher's fused path also saves. Each variant runs in its own process (its peak
memory is its own), torch on one thread (a slot's pinned core). The fused loop picks its
step mode on the first batch (all members through vmap, or one after another): the table
says which.

Models: ``mlp`` (32 -> 64 -> 10 on 2,048 fixed samples, batches of 64), ``cnn`` (two 3x3
convolutions of 8 and 16 channels on 1x28x28 inputs, 1,024 samples, batches of 64).
Figures: wall time, samples/s summed over the members, peak RSS less the process's RSS
before training, per member (on a GPU also torch's peak CUDA memory per member); and what a
learning leader (``fuse_max`` unset) measures of the N members: each size's share of a step
and memory, and the width it chooses.

    python bench/fused_training.py                       # mlp and cnn, N = 8, 32, 128
    python bench/fused_training.py --models mlp --sizes 8 16
    python bench/fused_training.py --device cuda         # on a GPU: torch's CUDA memory too
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EPOCHS = 2
DATA = {"mlp": (2048, (32,)), "cnn": (1024, (1, 28, 28))}


def _one(model: str, variant: str, count: int, device: str) -> dict[str, Any]:
    """Train ``count`` configs of ``model`` one way on ``device``; the figures of that run."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from furcate_hydra.fusion.fused_fit import MemberTraining, fused_fit
    from furcate_hydra.fusion.settings import TrainingShape

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Small(L.LightningModule):
        def __init__(self, lr: float, weight_decay: float) -> None:
            super().__init__()
            self.lr, self.weight_decay = lr, weight_decay
            if model == "mlp":
                self.net: nn.Module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
            else:
                self.net = nn.Sequential(
                    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
                )  # fmt: skip

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    samples, shape = DATA[model]
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(samples, *shape, generator=generator),
        torch.randint(0, 10, (samples,), generator=generator),
    )
    loader = DataLoader(data, batch_size=64)
    configs = [(10 ** -(1 + i % 4), 0.01 * (i // 4)) for i in range(count)]
    quiet: dict[str, Any] = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
    }
    accelerator = "gpu" if device == "cuda" else "cpu"
    quiet |= {"enable_model_summary": False, "accelerator": accelerator, "max_epochs": EPOCHS}
    modules = []
    for i, (lr, decay) in enumerate(configs):
        torch.manual_seed(i)
        modules.append(Small(lr, decay))
    if variant == "width":  # what a learning leader measures of these N members
        return _width(model, modules, loader, torch.device(device))
    before = _rss_mib()
    began = time.perf_counter()
    mode = "-"
    if variant == "fused":

        class Silent:
            def train_step(self, *args: Any) -> None: ...
            def validation_end(self, *args: Any) -> Any:
                return torch.zeros(count, dtype=torch.bool)

            def train_epoch_end(self, *args: Any) -> None: ...

        members = [MemberTraining(m, m.configure_optimizers()) for m in modules]
        training = TrainingShape.from_trainer(L.Trainer(**quiet))
        outcome = fused_fit(members, training, loader, None, Silent(), device=torch.device(device))
        mode = outcome.step_mode
    else:
        for module in modules:
            L.Trainer(**quiet).fit(module, loader)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - began
    gpu_mib = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0
    return {
        "model": model,
        "variant": variant,
        "members": count,
        "wall_s": round(wall, 3),
        "samples_per_s": round(count * samples * EPOCHS / wall, 1),
        "peak_mib_per_member": round(max(0.0, _peak_mib() - before) / count, 3),
        "device": device,
        "step_mode": mode,  # the fused loop's choice on the first batch: vmap or loop
        "gpu_peak_mib_per_member": round(gpu_mib / count, 3),
    }


def _width(model: str, modules: list[Any], loader: Any, device: Any) -> dict[str, Any]:
    """``fuse_max`` unset: the leader's measurement of these members, each size's share of a
    step and memory, and the width it chooses (auto_min_gain's default, 5 %)."""
    from furcate_hydra.fusion.fused_fit import to_device
    from furcate_hydra.fusion.group_width import learned_width
    from furcate_hydra.fusion.sample_batch import sample_batch

    optimizers = [m.configure_optimizers() for m in modules]
    batch = to_device(sample_batch(loader), device)
    width = learned_width(modules, optimizers, batch, 1, device, 0.05)
    return {
        "model": model,
        "variant": "width",
        "members": len(modules),
        "device": device.type,
        "width": width.width,
        "why": width.why,
        "trials": [
            {
                "size": t.size,
                "per_member_ms": round(t.per_member_s * 1e3, 4),
                "memory_mib": round(t.memory_bytes / 2**20, 2),
                "mode": t.mode,
            }
            for t in width.trials
        ],
    }


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _table(rows: list[dict[str, Any]]) -> None:
    header = f"{'model':5} {'N':>4} {'one fit each':>13} {'fused':>9} {'ratio':>7}"
    print(f"{header} {'samples/s alone/fused':>21} {'MiB/member a/f':>17} mode")
    by = {(r["model"], r["members"], r["variant"]): r for r in rows}
    for model, count in sorted({(r["model"], r["members"]) for r in rows}):
        alone, fused = by[(model, count, "alone")], by[(model, count, "fused")]
        print(
            f"{model:5} {count:>4} {alone['wall_s']:>12.2f}s {fused['wall_s']:>8.2f}s "
            f"{fused['wall_s'] / alone['wall_s']:>7.3f} "
            f"{alone['samples_per_s']:>10.0f}/{fused['samples_per_s']:<10.0f} "
            f"{alone['peak_mib_per_member']:>8.2f}/{fused['peak_mib_per_member']:<8.2f} "
            f"{fused['step_mode']}"
        )
    for row in (r for r in rows if r["variant"] == "width"):
        shares = ", ".join(
            f"{t['per_member_ms']:.3g} ms/{t['memory_mib']:.3g} MiB at {t['size']}"
            for t in row["trials"]
        )
        print(f"{row['model']:5} {row['members']:>4} width {row['width']}: {row['why']}")
        print(f"           a member's share of a step / memory: {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=sorted(DATA))
    parser.add_argument("--sizes", nargs="+", type=int, default=[8, 32, 128])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        model, variant, count, device = args.one
        print(json.dumps(_one(model, variant, int(count), device)))
        return
    from bench.harness import machine, publish

    at_start = machine()
    rows = []
    for model in args.models:
        for count in args.sizes:
            for variant in ("alone", "fused", "width"):
                done = subprocess.run(
                    [sys.executable, __file__, "--one", model, variant, str(count), args.device],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    publish(
        "fused_training", at_start, {"epochs": EPOCHS, "rows": rows}, lambda f: _table(f["rows"])
    )


if __name__ == "__main__":
    main()
