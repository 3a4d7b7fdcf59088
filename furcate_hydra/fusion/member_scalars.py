"""Floats a member's module keeps as its own attributes or ``hparams`` entries (a loss
weight): where members differ, each member's step sees its own.

Under ``vmap`` one module runs every member's step, so an attribute such as ``self.alpha`` in
``loss * self.alpha`` would be the first member's for all. The floats that differ between
members become one ``[N]`` tensor each, set on the module for the length of a step (a 0-d
tensor per member inside ``vmap``, in the parameters' dtype: a float32 tensor times a Python
float rounds as times that float's float32). Whether a step's arithmetic with such a tensor is
its arithmetic with the float, bitwise, the probe checks on each member (``probe``); any other
value that differs where a step reads it is a reason to run alone (``signature``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

_HPARAMS = "hparams."
_PLAIN = (bool, int, float, str)


def _attributes(module: nn.Module) -> dict[str, Any]:
    """The module's own plain values: public attributes and ``hparams`` entries."""
    found = {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_") and name != "training" and isinstance(value, _PLAIN)
    }
    hparams = getattr(module, "hparams", None)
    if isinstance(hparams, dict):
        found.update({_HPARAMS + k: v for k, v in hparams.items() if isinstance(v, _PLAIN)})
    return found


def float_names(module: nn.Module) -> list[str]:
    """The module's own floats that a step could see per member (``hparams.<key>`` for an
    ``hparams`` entry)."""
    return sorted(name for name, value in _attributes(module).items() if type(value) is float)


def differing_scalars(
    modules: Sequence[nn.Module],
    dtype: torch.dtype = torch.float32,
    names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The floats that differ between members (or, given, those ``names``), one ``[N]``
    tensor each. Other values that differ are the signature's to judge."""
    each = [_attributes(module) for module in modules]
    scalars: dict[str, torch.Tensor] = {}
    for name in sorted(set().union(*each)) if names is None else names:
        values = [found.get(name) for found in each]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not numbers or not any(isinstance(v, float) for v in values):
            continue
        if names is not None or any(v != values[0] for v in values):
            scalars[name] = torch.tensor([float(v) for v in values], dtype=dtype)  # type: ignore[arg-type]
    return scalars


@contextmanager
def scalars_set(module: nn.Module, values: dict[str, Any]) -> Iterator[None]:
    """``module``'s attributes (and ``hparams`` entries) set to ``values`` while the block runs."""
    saved: dict[str, Any] = {}
    hparams = getattr(module, "hparams", {})
    for name, value in values.items():
        if name.startswith(_HPARAMS):
            saved[name] = hparams[name[len(_HPARAMS) :]]
            hparams[name[len(_HPARAMS) :]] = value
        else:
            saved[name] = getattr(module, name)
            object.__setattr__(module, name, value)  # a tensor, not a registered buffer
    try:
        yield
    finally:
        for name, value in saved.items():
            if name.startswith(_HPARAMS):
                hparams[name[len(_HPARAMS) :]] = value
            else:
                object.__setattr__(module, name, value)
