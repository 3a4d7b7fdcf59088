"""What ``self.log`` records inside a vmapped step: one value per member, with its options.

Inside ``torch.func.vmap`` a logged tensor holds every member's value at once, and Lightning's
own ``log`` would reduce it as one number. So, for the length of a fused step, the module's
``log`` and ``log_dict`` record into a ``StepLogs`` instead; the step returns the recorded
values out of ``vmap``, which stacks them along the member axis.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class LogOptions:
    """How Lightning would treat one logged name (defaults of the hook it was logged in)."""

    on_step: bool
    on_epoch: bool
    reduce_fx: str
    batch_size: int | None
    logger: bool
    prog_bar: bool


@dataclass
class StepLogs:
    """The values one step logged (tensors, batched inside vmap) and their options."""

    in_training: bool
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    options: dict[str, LogOptions] = field(default_factory=dict)

    def record(self, name: str, value: Any, **kwargs: Any) -> None:
        reduce_fx = kwargs.get("reduce_fx", "mean")
        if not isinstance(reduce_fx, str) or reduce_fx not in ("mean", "sum", "max", "min"):
            raise UnfusableStep(f"self.log({name!r}) reduces with {reduce_fx!r}")
        on_step = kwargs.get("on_step")
        on_epoch = kwargs.get("on_epoch")
        logger = kwargs.get("logger")
        self.values[name] = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        self.options[name] = LogOptions(
            on_step=self.in_training if on_step is None else bool(on_step),
            on_epoch=(not self.in_training) if on_epoch is None else bool(on_epoch),
            reduce_fx=reduce_fx,
            batch_size=kwargs.get("batch_size"),
            logger=True if logger is None else bool(logger),
            prog_bar=bool(kwargs.get("prog_bar", False)),
        )

    def record_dict(self, values: Mapping[str, Any], **kwargs: Any) -> None:
        for name, value in values.items():
            self.record(name, value, **kwargs)


class UnfusableStep(Exception):
    """A step did something a fused step cannot do for each member: the reason is its text."""


@contextmanager
def recording_logs(module: nn.Module, logs: StepLogs) -> Iterator[StepLogs]:
    """``module.log`` and ``module.log_dict`` record into ``logs`` while the block runs."""
    module.log = lambda name, value, *args, **kwargs: logs.record(  # type: ignore[assignment]
        name, value, **_positional(args, kwargs)
    )
    module.log_dict = lambda values, *args, **kwargs: logs.record_dict(  # type: ignore[assignment]
        values, **_positional(args, kwargs)
    )
    try:
        yield logs
    finally:
        del module.log
        del module.log_dict


# LightningModule.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, ...)
_POSITIONAL = ("prog_bar", "logger", "on_step", "on_epoch", "reduce_fx")


def _positional(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    named = dict(zip(_POSITIONAL, args, strict=False))
    named.update(kwargs)
    return named
