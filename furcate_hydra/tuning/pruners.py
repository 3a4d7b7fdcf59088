"""Optuna pruners from plain values: ``{"name": "median", "n_startup_trials": 5}``.

The study's storage does not keep its pruner, so the sweeper and every trial's job each build
the same pruner from the same values. Imports Optuna only (no torch), for the sweeper's process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError

__all__ = ["PRUNERS", "pruner_from_spec"]

PRUNER_VAR = env_vars.OPTUNA_PRUNER

PRUNERS: dict[str, Callable[..., BasePruner]] = {
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "threshold": optuna.pruners.ThresholdPruner,
    "patient": optuna.pruners.PatientPruner,
    "nop": optuna.pruners.NopPruner,
    "none": optuna.pruners.NopPruner,  # the sweeper's name for it (hydra/sweeper/pruner=none)
}


def pruner_from_spec(spec: str | Mapping[str, Any]) -> BasePruner:
    """Build a pruner from ``{"name": ..., **constructor_kwargs}`` (a dict or its JSON).

    ``patient`` takes its ``wrapped_pruner`` as a nested spec.

    Raises:
        FurcateConfigError: Not JSON, an unknown name, or arguments the pruner rejects.
    """
    try:
        data = dict(json.loads(spec) if isinstance(spec, str) else spec)
    except (ValueError, TypeError) as e:
        raise FurcateConfigError(
            PRUNER_VAR, spec, f"not a JSON object ({e})", 'set e.g. {"name": "median"}'
        ) from e
    name = data.pop("name", None)
    if name not in PRUNERS:
        raise FurcateConfigError(
            PRUNER_VAR,
            spec,
            f"unknown pruner {name!r}; known: {sorted(PRUNERS)}",
            'set "name" to one of those',
        )
    if name == "patient" and data.get("wrapped_pruner") is not None:
        data["wrapped_pruner"] = pruner_from_spec(data["wrapped_pruner"])
    try:
        return PRUNERS[name](**data)
    except (TypeError, ValueError) as e:
        raise FurcateConfigError(
            PRUNER_VAR,
            spec,
            f"{name} rejects these arguments: {e}",
            f"pass only arguments of optuna.pruners for {name!r}",
        ) from e
