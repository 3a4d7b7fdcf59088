"""Everything a member's module holds besides its tensors, as comparable leaves by path: its
own public attributes, its ``hparams`` (nested configs included) and its child modules'.

    alpha -> 0.3                        hparams.model.loss.weight -> 0.5
    loss_fn.label_smoothing -> 0.1      hparams.optimizer.keywords.lr -> 0.01 (a partial)

Two members whose steps read a path (``step_reads``) where their leaves differ cannot share one
module's steps, unless furcate sets that value per member (``member_scalars``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

_PLAIN = (type(None), bool, int, float, str, bytes)
_DEPTH = 6
_DIGESTED = 1 << 20  # a tensor with more elements than this is compared by shape and dtype


def module_values(module: nn.Module) -> dict[str, str]:
    """Every leaf ``module`` holds outside its parameters and buffers, by path, as a string
    that compares like the value (``repr`` of plain values, a digest of a tensor's bytes)."""
    leaves: dict[str, str] = {}
    seen: set[int] = set()
    for prefix, child in module.named_modules():
        for name, value in vars(child).items():
            if name.startswith("_") or name == "training":
                continue
            _flatten(f"{prefix}.{name}" if prefix else name, value, leaves, seen, 0)
    hparams = getattr(module, "hparams", None)
    if isinstance(hparams, Mapping):
        _flatten("hparams", hparams, leaves, seen, 0)
    return leaves


def _flatten(path: str, value: Any, leaves: dict[str, str], seen: set[int], depth: int) -> None:
    if isinstance(value, _PLAIN):
        leaves[path] = repr(value)
        return
    if isinstance(value, torch.Tensor):
        leaves[path] = _tensor(value)
        return
    if isinstance(value, nn.Module) or depth >= _DEPTH or id(value) in seen:
        leaves[path] = f"<{type(value).__qualname__}>"  # a module's own values are its own paths
        return
    seen.add(id(value))
    try:
        for key, item in _items(value):
            _flatten(f"{path}.{key}" if key else path, item, leaves, seen, depth + 1)
    finally:
        seen.discard(id(value))


def _items(value: Any) -> list[tuple[str, Any]]:
    """What a value holds, by key: a mapping's entries (an OmegaConf DictConfig's too), a
    sequence's items, a partial's function and arguments, an object's attributes; else its
    kind alone."""
    if isinstance(value, Mapping):
        return [(str(k), value[k]) for k in value]
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [(str(i), item) for i, item in enumerate(value)]
    if isinstance(value, functools.partial):
        return [("func", _named(value.func)), ("args", value.args), ("keywords", value.keywords)]
    if callable(value) and hasattr(value, "__qualname__"):
        return [("", _named(value))]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [("__class__", type(value).__qualname__)] + [
            (k, v) for k, v in attributes.items() if not k.startswith("_")
        ]
    return [("", f"<{type(value).__qualname__}>")]


def _named(function: Any) -> str:
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', function)}"


def _tensor(value: torch.Tensor) -> str:
    kind = f"tensor{tuple(value.shape)} {value.dtype}"
    if value.numel() > _DIGESTED or value.is_meta:
        return kind
    data = value.detach().cpu().contiguous()
    return f"{kind} {hashlib.sha1(data.numpy().tobytes()).hexdigest()[:16]}"
