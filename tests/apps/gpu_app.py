"""A Hydra app for the real-GPU tests: a job writes what it saw of its GPU to ``gpu.json``, then
behaves as ``mode`` says.

    env   nothing more
    hold  holds ``start_gib`` of GPU memory for ``ramp_s`` s, then ``fraction`` of the GPU's
          total memory (or ``gib``) for ``hold_s`` s; jobs i < ``small_jobs`` hold
          ``start_gib`` only, for ``small_hold_s`` s. A CUDA out-of-memory error is recorded
          as the attempt's outcome, then raised as a user's job would.
    mps   asks the MPS control daemon for its servers (``get_server_list``) while holding a
          CUDA context, then holds it ``hold_s`` s

Every attempt is appended to ``attempts.jsonl`` (``bench.sweep_reading``). Torch is imported
inside the task: the launcher's process stays light, the fork server preloads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from bench.sweep_reading import record_attempt

GIB = 1 << 30
ENV = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "FURCATE_SLOT")


def seen() -> dict[str, Any]:
    """The GPU as this job's CUDA sees it, and the environment that chose it."""
    import torch

    properties = torch.cuda.get_device_properties(0)
    uuid = str(properties.uuid)
    return {
        **{name: os.environ.get(name) for name in ENV},
        "device_count": torch.cuda.device_count(),
        # NVML writes "GPU-<uuid>", torch the bare uuid
        "uuid": uuid if uuid.startswith("GPU-") else f"GPU-{uuid}",
        "name": properties.name,
        "total_memory": int(properties.total_memory),
    }


def hold(cfg: DictConfig, total: int) -> None:
    import torch

    first = torch.empty(int(float(cfg.start_gib) * GIB), dtype=torch.uint8, device="cuda")
    first.fill_(1)
    torch.cuda.synchronize()
    if int(cfg.i) < int(cfg.small_jobs):
        time.sleep(float(cfg.small_hold_s))
        return
    time.sleep(float(cfg.ramp_s))
    fraction = cfg.fraction
    target = int(float(fraction) * total) if fraction is not None else int(float(cfg.gib) * GIB)
    rest = torch.empty(max(0, target - first.numel()), dtype=torch.uint8, device="cuda")
    rest.fill_(1)
    torch.cuda.synchronize()
    time.sleep(float(cfg.hold_s))


def ask_mps(cfg: DictConfig) -> dict[str, Any]:
    import torch

    context = torch.ones(1, device="cuda")  # a client: the daemon has started its server
    torch.cuda.synchronize()
    control = shutil.which("nvidia-cuda-mps-control")
    asked = subprocess.run(
        [control or "nvidia-cuda-mps-control"],
        input="get_server_list\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    time.sleep(float(cfg.hold_s))
    del context
    return {"server_list": asked.stdout.split(), "returncode": asked.returncode}


@hydra.main(version_base="1.3", config_path="conf", config_name="gpu")
def main(cfg: DictConfig) -> Any:
    import torch

    out = Path(HydraConfig.get().runtime.output_dir)
    started = time.time()
    info = seen()
    (out / "gpu.json").write_text(json.dumps(info))
    try:
        if cfg.mode == "hold":
            hold(cfg, info["total_memory"])
        elif cfg.mode == "mps":
            info["mps"] = ask_mps(cfg)
            (out / "gpu.json").write_text(json.dumps(info))
    except torch.cuda.OutOfMemoryError:
        record_attempt(out, started, "oom")
        raise
    record_attempt(out, started, "ok")
    return info


if __name__ == "__main__":
    main()
