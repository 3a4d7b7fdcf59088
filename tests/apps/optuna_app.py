"""A Hydra app for Optuna sweeper tests: a sphere to minimise, with knobs for timing and faults.

Records what its job saw (``probe.json``, as the probe app does). Job ``slow_job`` sleeps
``slow_s`` instead of ``sleep``, so a test can hold one slot busy while others turn over.
``returns`` picks how many values come back; ``mode=raise`` fails the job; ``+prune_at=N``
marks the job's trial pruned at epoch N, as ``fit``'s pruning callback does; ``+epochs=N``
reports its value for N epochs through ``OptunaPruning`` (what ``fit`` reports with), stopping
where the pruner says (``pruned_at`` in ``reported.json``); ``+odd_jobs_worse=true`` makes
odd-numbered jobs far worse than the others, which a pruner then stops.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from probe_app import record  # type: ignore[import-not-found]  # a sibling script

from furcate_hydra import env_vars


@hydra.main(version_base=None, config_path="conf", config_name="optuna")
def main(cfg: DictConfig) -> Any:
    if HydraConfig.get().job.num == cfg.slow_job:
        time.sleep(float(cfg.slow_s))
    record(cfg)
    if cfg.mode == "raise":
        raise ValueError("the task raised on purpose")
    if cfg.get("prune_at") is not None:
        prune(int(cfg.prune_at))
    value = (float(cfg.x) - 1.0) ** 2 + float(cfg.y) ** 2
    if cfg.get("odd_jobs_worse") and HydraConfig.get().job.num % 2:
        value = 1e6  # worse than the median of any two finished trials with an even one
    if cfg.get("epochs") is not None:
        report(value, int(cfg.epochs))
    if cfg.returns == 2:
        return value, -value
    if cfg.returns == "none":
        return None
    return value


def prune(epoch: int) -> None:
    """What the pruning callback leaves when the pruner stops the trial at ``epoch``: a value
    reported per epoch, and the epoch it stopped at on the trial."""
    from furcate_hydra.tuning.storage import rdb_storage

    storage = rdb_storage(os.environ[env_vars.OPTUNA_STORAGE], create_tables=False)
    study = storage.get_study_id_from_name(os.environ[env_vars.OPTUNA_STUDY])
    number = int(os.environ[env_vars.OPTUNA_TRIAL_NUMBER])
    trial = storage.get_trial_id_from_study_id_trial_number(study, number)
    for step in range(epoch + 1):
        storage.set_trial_intermediate_value(trial, step, 1.0)
    storage.set_trial_system_attr(trial, env_vars.PRUNED_AT_EPOCH_ATTR, epoch)


def report(value: float, epochs: int) -> None:
    from furcate_hydra.lightning import OptunaPruning

    pruning = OptunaPruning.from_environ()
    for epoch in range(epochs):
        if pruning.report(value, epoch):
            break
    out = Path(HydraConfig.get().runtime.output_dir) / "reported.json"
    out.write_text(json.dumps({"reported": pruning.reported, "pruned_at": pruning.pruned_at_epoch}))


if __name__ == "__main__":
    main()
