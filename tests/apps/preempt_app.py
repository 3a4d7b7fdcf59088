"""A Lightning task for the preemption tests: the dropout model of ``dropout_regression.py``,
trained through ``fit``; returns the sha256 of its final weights and where it resumed.

``pause_s`` slows every step of a run's first process (a relaunch, which finds its run's
``executed.jsonl``, trains at full speed), so a test can signal the job mid-epoch. Each trained
batch is logged to ``executed.jsonl`` in the run's checkpoint dir, which survives relaunches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="preempt")
def main(cfg: DictConfig) -> Any:
    from dropout_regression import train, weights_digest  # type: ignore[import-not-found]

    from furcate_hydra.lightning import JobEnv

    env = JobEnv.from_environ(default_output_dir=Path(HydraConfig.get().runtime.output_dir))
    env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    log_path = env.checkpoint_dir / "executed.jsonl"
    pause_s = 0.0 if log_path.exists() else float(cfg.pause_s)
    model, result = train(
        env,
        epochs=int(cfg.epochs),
        workers=int(cfg.workers),
        model={"log_path": log_path, "pause_s": pause_s},
    )
    resumed = result.resumed_from is not None
    return {
        "weights": weights_digest(model),
        "resumed_at": [result.resumed_at_epoch, result.resumed_at_batch] if resumed else None,
    }


if __name__ == "__main__":
    main()
