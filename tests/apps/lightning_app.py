"""A tiny Lightning task for resume tests: slow epochs, and a log of which epochs each process ran.

``epoch_sleep`` stretches every epoch of a run's first process, so a test can interrupt a job
mid-training; a relaunch of the run (resumed or started over) trains at full speed. Each
executed epoch is appended to ``executed.jsonl`` in the run's checkpoint dir (which survives
a relaunch), so a test can tell a resumed job from one that started over.

Torch and Lightning are imported inside the task function (from ``slow_regression.py``): the
launcher's process does not need them, and the fork server has them preloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="lightning")
def main(cfg: DictConfig) -> Any:
    from slow_regression import SlowRegression, loader  # type: ignore[import-not-found]

    from furcate_hydra.lightning import JobEnv, fit

    env = JobEnv.from_environ(default_output_dir=Path(HydraConfig.get().runtime.output_dir))
    env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    log_path = env.checkpoint_dir / "executed.jsonl"
    # a relaunch finds the epochs its run executed before: no need to be slow any more
    epoch_sleep = 0.0 if log_path.exists() else float(cfg.epoch_sleep)
    warning = cfg.get("user_warning")  # +user_warning=...: the model warns it while training
    model = SlowRegression(float(cfg.lr), epoch_sleep, log_path, warning)
    result = fit(
        model,
        train_dataloaders=loader(0),
        val_dataloaders=loader(1),
        trainer_options={
            "max_epochs": int(cfg.epochs),
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
        },
        env=env,
    )
    return {"val_loss": result.metrics["val_loss"], "epochs": result.epochs_completed}


if __name__ == "__main__":
    main()
