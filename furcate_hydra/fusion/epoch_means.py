"""Lightning's epoch value of a logged name: its values over the epoch's batches, reduced as
Lightning's ``_ResultMetric`` reduces them, one per member.

The same arithmetic in the same order and dtype (a float32 running sum of ``value *
batch_size``, an integer count, one division at the end), so that each member's epoch value
is its own run's, bitwise, and so is what its early stopping judges.
"""

from __future__ import annotations

import torch

from furcate_hydra.fusion.step_logs import LogOptions


def _dtype() -> torch.dtype:
    """Lightning's: the default dtype, no lower than float32."""
    default = torch.get_default_dtype()
    return default if default in (torch.float32, torch.float64) else torch.float32


class EpochMeans:
    """The running reduction of every name logged ``on_epoch`` over an epoch."""

    def __init__(self) -> None:
        self._values: dict[str, torch.Tensor] = {}
        self._counts: dict[str, torch.Tensor] = {}
        self._reduce: dict[str, str] = {}
        self.latest: dict[str, torch.Tensor] = {}

    def add(
        self, values: dict[str, torch.Tensor], options: dict[str, LogOptions], batch_size: int
    ) -> None:
        for name, value in values.items():
            option = options[name]
            self.latest[name] = value
            if not option.on_epoch:
                continue
            value = value.detach()
            if value.dtype not in (torch.float32, torch.float64):
                value = value.to(_dtype())
            size = int(option.batch_size or batch_size)
            reduce = self._reduce.setdefault(name, option.reduce_fx)
            if name not in self._values:
                start = {"max": float("-inf"), "min": float("inf")}.get(reduce, 0.0)
                self._values[name] = torch.full_like(value, start, dtype=_dtype())
                self._counts[name] = torch.tensor(0)
            if reduce == "mean":
                self._values[name] = self._values[name] + value * size
                self._counts[name] = self._counts[name] + size
            elif reduce == "max":
                self._values[name] = torch.max(self._values[name], value)
            elif reduce == "min":
                self._values[name] = torch.min(self._values[name], value)
            else:
                self._values[name] = self._values[name] + value

    def result(self) -> dict[str, torch.Tensor]:
        """Each name's epoch value, one per member."""
        return {
            name: total / self._counts[name] if self._reduce[name] == "mean" else total.clone()
            for name, total in self._values.items()
        }
