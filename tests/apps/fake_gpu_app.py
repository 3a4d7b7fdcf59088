"""A job that takes GPU memory on a fake GPU (``tests/fakes/nvml``), as a CUDA job would.

Each step holds ``steps[i][0]`` GiB on the job's GPU for ``steps[i][1]`` s, written where the
fake NVML reads it (``held/<gpu>/<pid>``). A step that does not fit beside what the other
processes hold raises torch's own ``OutOfMemoryError`` with CUDA's message, in the job or in a
DataLoader worker, as the caching allocator would. Each start and end is appended to
``events.log`` in the fake NVML's dir (with the job's CUDA_DEVICE_ORDER and MPS pipe dir), to
count the jobs a GPU ran at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset


class _OutOfMemoryInWorker(Dataset[int]):
    def __init__(self, message: str) -> None:
        self.message = message

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        raise torch.cuda.OutOfMemoryError(self.message)


def _log(state: Path, what: str, gpu: str) -> None:
    order = os.environ.get("CUDA_DEVICE_ORDER", "unset")
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "none")
    with (state / "events.log").open("a") as file:
        file.write(f"{what} {time.time():.4f} {gpu} {os.getpid()} {order} {mps}\n")


def _hold(state: Path, gpu: str, mib: float, oom_in: str) -> None:
    """Hold ``mib`` on ``gpu``, or run out of memory as CUDA would."""
    total = json.loads((state / "gpus.json").read_text())[int(gpu)]["total_mib"]
    held = state / "held" / gpu
    held.mkdir(parents=True, exist_ok=True)
    mine = held / str(os.getpid())
    with (state / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        others = 0.0
        for file in held.glob("*"):
            if file != mine and _alive(int(file.name)):
                # a job that ended since the listing frees its memory without the lock
                with contextlib.suppress(FileNotFoundError):
                    others += float(file.read_text() or 0)
        if others + mib > total:
            mine.unlink(missing_ok=True)
            message = (
                f"CUDA out of memory. Tried to allocate {mib / 1024:.2f} GiB. GPU {gpu} has a "
                f"total capacity of {total / 1024:.2f} GiB of which "
                f"{(total - others) / 1024:.2f} GiB is free."
            )
            if oom_in == "worker":
                for _ in DataLoader(_OutOfMemoryInWorker(message), num_workers=1):
                    pass
            raise torch.cuda.OutOfMemoryError(message)
        mine.write_text(str(mib))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@hydra.main(config_path="conf", config_name="fake_gpu", version_base=None)
def main(cfg: DictConfig) -> float:
    state = Path(os.environ["FURCATE_FAKE_NVML"])
    gpu = os.environ["CUDA_VISIBLE_DEVICES"]
    _log(state, "start", gpu)
    if cfg.mps_fault:  # what an MPS server logs when a client's kernel faults, then the error
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log_dir = Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
        with (log_dir / "server.log").open("a") as file:
            file.write(f"[{stamp}.000 Server {os.getpid()}] {cfg.mps_fault}\n")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    try:
        for gib, seconds in cfg.steps:
            _hold(state, gpu, gib * 1024, cfg.oom_in)
            time.sleep(seconds)
    finally:
        (state / "held" / gpu / str(os.getpid())).unlink(missing_ok=True)
        _log(state, "end", gpu)
    return float(cfg.x)


if __name__ == "__main__":
    main()
