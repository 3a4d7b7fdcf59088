"""Numbers a member's module keeps as plain attributes (a loss weight, an ``hparams`` entry):
where members differ, each member's step sees its own.

Under ``vmap`` one module runs every member's step, so an attribute such as ``self.alpha`` in
``loss * self.alpha`` would be the first member's for all. The floats that differ between
members become one ``[N]`` tensor each, set on the module for the length of a step (a 0-d
tensor per member inside ``vmap``, in the parameters' dtype: a float32 tensor times a Python
float rounds as times that float's float32). Other values that differ (an int, a string, a
flag) may steer control flow or shapes: reasons to run alone.
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


def differing_scalars(
    modules: Sequence[nn.Module], dtype: torch.dtype = torch.float32
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The floats that differ between members, one ``[N]`` tensor each; and the reasons the
    other differing values give to run alone (empty: none)."""
    each = [_attributes(module) for module in modules]
    scalars: dict[str, torch.Tensor] = {}
    reasons = []
    for name in sorted(set().union(*each)):
        values = [found.get(name) for found in each]
        if all(value == values[0] and type(value) is type(values[0]) for value in values):
            continue
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numbers and any(isinstance(v, float) for v in values):
            scalars[name] = torch.tensor([float(v) for v in values], dtype=dtype)  # type: ignore[arg-type]
        else:
            reasons.append(
                f"its module's {name} differs ({', '.join(repr(v) for v in values[:3])}…)"
            )
    return scalars, reasons


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
