"""Train from config, as the Hydra + Lightning template's ``src/train.py`` does: the app builds
its own Trainer, callbacks and loggers. Nothing in it knows about furcate; run it with
``hydra/launcher=furcate`` and each job resumes, records and reports by itself."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf

# the project root on sys.path, so `src.` imports work from any working directory (the
# template does this with rootutils)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def instantiate_all(configs: DictConfig | None) -> list[Any]:
    """Each entry of a callbacks or logger group that has a ``_target_``."""
    return [
        hydra.utils.instantiate(entry)
        for entry in (configs or {}).values()
        if isinstance(entry, DictConfig) and "_target_" in entry
    ]


def train(cfg: DictConfig) -> float | None:
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    model: L.LightningModule = hydra.utils.instantiate(cfg.model)
    callbacks = instantiate_all(cfg.get("callbacks"))
    loggers = instantiate_all(cfg.get("logger"))
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers)
    # the template's log_hyperparameters: the config's parts, as the loggers take them
    hparams = {
        key: OmegaConf.to_container(value, resolve=True)
        if OmegaConf.is_config(value := cfg.get(key))
        else value
        for key in ("model", "data", "trainer", "tags", "ckpt_path", "seed")
    }
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
    if cfg.get("train"):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    if cfg.get("test"):
        best = trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
        trainer.test(model=model, datamodule=datamodule, ckpt_path=best or None)
    metric = cfg.get("optimized_metric")
    return metrics.get(metric) if metric else None


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    return train(cfg)


if __name__ == "__main__":
    main()
