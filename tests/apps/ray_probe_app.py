"""The probe app (its modes), plus what only a Ray slot can suffer: its actor killed under a
running job."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import hydra
import psutil
from omegaconf import DictConfig
from probe_app import misbehave, record  # type: ignore[import-not-found]  # a sibling script


def kill_slot_actor(once: bool, marker_dir: str) -> None:
    """SIGKILL the Ray worker that holds this job's slot (the fork server's parent), as a
    node's out-of-memory killer or a lost node would end it. (The launcher's environment
    does not reach jobs on Ray: the marker's folder comes in the config.)"""
    if once:
        marker = Path(marker_dir) / "killed-slot-once"
        if marker.exists():
            return
        marker.write_text("x")
    actor = psutil.Process(os.getppid()).ppid()
    os.kill(actor, signal.SIGKILL)
    signal.pause()  # the fork server stops this job once its actor is gone


@hydra.main(version_base="1.3", config_path="conf", config_name="probe")
def main(cfg: DictConfig) -> Any:
    info = record(cfg)
    mode = str(cfg.mode)
    if mode in ("kill_slot", "kill_slot_once"):
        kill_slot_actor(mode == "kill_slot_once", str(cfg.get("marker_dir", ".")))
        return "recovered"
    if mode == "print":
        print(f"job {info['num']} says hello from slot {info['slot']}", flush=True)
    if mode in ("ok", "print"):
        return info
    return misbehave(mode)


if __name__ == "__main__":
    main()
