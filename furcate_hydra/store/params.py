"""A job's task config as MLflow params: dotted keys, one value each, within MLflow's limits."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["flatten_params"]

# mlflow.utils.validation: MAX_ENTITY_KEY_LENGTH and MAX_PARAM_VAL_LENGTH.
MAX_KEY = 250
MAX_VALUE = 6000


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys: ``{"model": {"lr": 0.1}, "layers": [64]}`` → ``model.lr=0.1, layers=[64]``.

    Lists stay one param (their JSON text): the MLflow UI compares runs by param, and a list
    of layer sizes is one choice, not several. Overlong values are cut with a marker, since
    MLflow would refuse the whole batch.
    """
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, f"{name}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > MAX_VALUE:
            text = text[: MAX_VALUE - 15] + "...(truncated)"
        flat[name[:MAX_KEY]] = text
    return flat
