"""A Hydra app for tests: records what its job process saw, then behaves as ``mode`` says."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def record(cfg: DictConfig) -> dict[str, Any]:
    """What the job saw, written to ``probe.json`` in its output dir."""
    started = time.time()
    info = {
        "num": HydraConfig.get().job.num,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slot": os.environ.get("FURCATE_SLOT"),
        "gpus_per_job": os.environ.get("FURCATE_GPUS_PER_JOB"),
        "optuna_prune_url": os.environ.get("FURCATE_OPTUNA_PRUNE_URL"),
        "affinity": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": _torch_threads(),
        "started_at": started,
    }
    time.sleep(float(cfg.get("sleep", 0.0)))
    info["ended_at"] = time.time()
    out = Path(HydraConfig.get().runtime.output_dir) / "probe.json"
    out.write_text(json.dumps(info))
    return info


def _torch_threads() -> int | None:
    torch: Any = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def misbehave(mode: str) -> Any:
    print(f"about to {mode}", flush=True)
    print(f"stderr line before {mode}", file=sys.stderr, flush=True)
    if mode == "raise":
        raise ValueError("the task raised on purpose")
    if mode == "exit":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(4)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "unpicklable":
        return (i for i in range(3))  # generators cannot be pickled
    if mode == "crash_once":
        marker = Path(os.environ["PROBE_MARKER_DIR"]) / f"crashed-{os.getpid()}"
        if not any(marker.parent.glob("crashed-*")):
            marker.write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
        return "recovered"
    if mode in ("sigterm_once", "sigusr1_once", "sigterm_always"):
        # preempted from outside, as a scheduler does: by a signal the launcher did not send
        signum = signal.SIGUSR1 if mode == "sigusr1_once" else signal.SIGTERM
        marker = Path(os.environ["PROBE_MARKER_DIR"]) / f"preempted-{os.getpid()}"
        if mode == "sigterm_always" or not any(marker.parent.glob("preempted-*")):
            marker.write_text("x")
            os.kill(os.getpid(), signum)
            time.sleep(60)  # the signal ends the process before this does
        return "recovered"
    if mode == "cuda":
        import torch

        # the job must see exactly its slot's GPU, and be able to use it
        device = torch.device("cuda", 0)
        total = float(torch.ones(1024, device=device).sum().item())
        return {
            "device_count": torch.cuda.device_count(),
            "uuid": str(torch.cuda.get_device_properties(0).uuid),
            "sum": total,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    if mode == "progress":
        # what fit's ProgressFile writes, twice, far enough apart for the launcher to see both
        from furcate_hydra.progress import write_progress

        path = Path(HydraConfig.get().runtime.output_dir) / "progress.json"
        for epoch in range(2):
            write_progress(path, epoch, 10 * (epoch + 1), {"loss": 1.0 / (epoch + 1)})
            time.sleep(2.5)
        return "ok"
    if mode == "spawn_and_hang":
        # Children in the job's process group, as DataLoader workers would be.
        for _ in range(2):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        time.sleep(600)
    return "ok"


def hold(cfg: DictConfig) -> Any:
    """A child process (as a DataLoader worker would be) holds ``hold_mb`` MiB for ``hold_s``
    seconds; then the job returns, or with ``then=sigkill`` is killed as the OOM killer would."""
    code = (
        "import sys, time; held = b'\\x01' * (int(sys.argv[1]) << 20); "
        "print('holding', flush=True); time.sleep(float(sys.argv[2]))"
    )
    args = [sys.executable, "-c", code, str(cfg.hold_mb), str(cfg.hold_s)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "holding\n"
    if cfg.get("then") == "sigkill":
        time.sleep(float(cfg.hold_s) / 2)
        os.kill(os.getpid(), signal.SIGKILL)
    child.wait()
    return "held"


@hydra.main(version_base="1.3", config_path="conf", config_name="probe")
def main(cfg: DictConfig) -> Any:
    info = record(cfg)
    mode = str(cfg.mode)
    if mode == "ok":
        return info
    if mode == "hold":
        return hold(cfg)
    if mode == "value":  # a number to compare jobs by, as a tuned task returns
        return float(cfg.get("lr", 0.0))
    if mode == "metric":
        # a metric in the job's run, as a task logging to MLflow leaves one
        from mlflow.tracking import MlflowClient

        client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
        client.log_metric(os.environ["MLFLOW_RUN_ID"], "score", float(cfg.get("lr", 0.0)))
        return "ok"
    return misbehave(mode)


if __name__ == "__main__":
    main()
