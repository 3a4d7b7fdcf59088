"""A stable identity for a job's configuration.

Two jobs with the same resolved task config (Hydra's ``hydra`` node left out) get the same
fingerprint on any machine, in any process, whatever the key order or Python's hash seed: it
is the SHA-256 of a canonical JSON text. MLflow stores it as a tag, so a rerun can find the
configs that already finished.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["canonical_json", "fingerprint"]


def fingerprint(config: Mapping[str, Any], ignore: Iterable[str] = ()) -> str:
    """Hex SHA-256 of ``config`` without its ``hydra`` node and the dotted keys in ``ignore``.

    Args:
        config: the resolved task config as plain containers (``OmegaConf.to_container``).
        ignore: dotted keys that do not change a job's result (a data path, ``num_workers``);
            a key missing from this config is skipped, since group choices differ per job.

    Raises:
        TypeError: a value has no stable text form; the message names its key.
    """
    kept = {key: value for key, value in config.items() if key != "hydra"}
    for dotted in ignore:
        _drop(kept, dotted.split("."))
    return hashlib.sha256(canonical_json(kept).encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, floats in their shortest round-trip form."""
    return json.dumps(
        _normalise(value, "<root>"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def _normalise(value: Any, key: str) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # NaN and infinities are not JSON; a tagged string keeps them distinct and stable.
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, Mapping):
        return {str(k): _normalise(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, PurePath):
        return {"__path__": value.as_posix()}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    raise TypeError(
        f"config value at {key} has type {type(value).__qualname__}, which has no stable text "
        "form for a fingerprint; use a plain number, string, list or mapping there, or list "
        "the key in fingerprint_ignore"
    )


def _drop(node: Any, path: list[str]) -> None:
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            return
        node[part] = dict(node[part]) if isinstance(node[part], Mapping) else node[part]
        node = node[part]
    if isinstance(node, dict):
        node.pop(path[-1], None)
