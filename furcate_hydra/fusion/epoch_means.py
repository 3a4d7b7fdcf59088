"""Lightning's epoch value of a logged name: its values over the epoch's batches, reduced
(``mean`` weighted by batch size, as Lightning weights it), one per member."""

from __future__ import annotations

import torch

from furcate_hydra.fusion.step_logs import LogOptions


class EpochMeans:
    """The running reduction of every name logged ``on_epoch`` over an epoch."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._weights: dict[str, float] = {}
        self._reduce: dict[str, str] = {}
        self.latest: dict[str, torch.Tensor] = {}

    def add(
        self,
        values: dict[str, torch.Tensor],
        options: dict[str, LogOptions],
        batch_size: int,
    ) -> None:
        for name, value in values.items():
            option = options[name]
            self.latest[name] = value
            if not option.on_epoch:
                continue
            value = value.detach().to(torch.float64)
            weight = float(option.batch_size or batch_size)
            reduce = option.reduce_fx
            self._reduce[name] = reduce
            if name not in self._sums:
                self._sums[name] = value * weight if reduce == "mean" else value.clone()
                self._weights[name] = weight
                continue
            if reduce == "mean":
                self._sums[name] += value * weight
                self._weights[name] += weight
            elif reduce == "sum":
                self._sums[name] += value
            elif reduce == "max":
                self._sums[name] = torch.maximum(self._sums[name], value)
            else:
                self._sums[name] = torch.minimum(self._sums[name], value)

    def result(self) -> dict[str, torch.Tensor]:
        """Each name's epoch value, one per member (float32, as Lightning logs it)."""
        out = {}
        for name, total in self._sums.items():
            value = total / self._weights[name] if self._reduce[name] == "mean" else total
            out[name] = value.to(torch.float32)
        return out
