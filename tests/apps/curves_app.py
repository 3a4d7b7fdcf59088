"""A Hydra app for report tests: logs learning curves (and, on even jobs, a resource trace)
into its MLflow run the way Lightning's logger does, then returns its last validation loss.

Each epoch's metrics go in at that epoch's last step with an ``epoch`` metric beside them;
``lr == fail_lr`` fails the job. No torch: the fork server starts in under a second.
"""

from __future__ import annotations

import math
import os
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

STEPS_PER_EPOCH = 10


@hydra.main(version_base="1.3", config_path="conf", config_name="curves")
def main(cfg: DictConfig) -> float:
    lr, batch_size = float(cfg.lr), int(cfg.batch_size)
    if lr == float(cfg.fail_lr):
        raise ValueError(f"lr={lr} diverged")
    now = int(time.time() * 1000)
    metrics = []
    val_loss = 0.0
    for epoch in range(int(cfg.epochs)):
        step = (epoch + 1) * STEPS_PER_EPOCH - 1
        train_loss = math.exp(-lr * 10 * (epoch + 1)) + 32 / batch_size / 10
        val_loss = train_loss + 0.05
        metrics += [
            Metric("train_loss", train_loss, now, step),
            Metric("val_loss", val_loss, now, step),
            Metric("epoch", float(epoch), now, step),
        ]
    if HydraConfig.get().job.num % 2 == 0:  # a resource trace, as the launcher samples one
        for sample in range(3):
            metrics += [
                Metric("job/rss_mb", 100.0 + 10 * sample, now + sample, sample),
                Metric("job/cpu_percent", 50.0 + sample, now + sample, sample),
            ]
    MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).log_batch(
        os.environ["MLFLOW_RUN_ID"], metrics=metrics
    )
    return val_loss


if __name__ == "__main__":
    main()
