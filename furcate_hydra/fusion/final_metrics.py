"""Each member's ``trainer.callback_metrics`` at the end of its fit, named as Lightning names
them: a value logged both on step and on epoch as ``name`` (its epoch value), ``name_step``
and ``name_epoch``; logged on step only as ``name`` (its latest value); on epoch only as
``name``. A member stopped early keeps what it had when it stopped (its stopping epoch's
training means included, as Lightning logs them after the validation that stopped it)."""

from __future__ import annotations

import torch

from furcate_hydra.fusion.step_logs import LogOptions


class FinalMetrics:
    """A ``FusionObserver`` that keeps each member's latest callback metrics (it stops no
    member itself); ``stopped`` freezes the members a caller stopped."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.metrics: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
        self.both: set[str] = set()  # names logged on step and on epoch
        self.stopped_in: list[int | None] = [None] * count

    def _open(self, member: int, epoch: int) -> bool:
        stopped = self.stopped_in[member]
        return stopped is None or stopped == epoch

    def train_step(
        self, step: int, epoch: int, logs: dict[str, torch.Tensor], options: dict[str, LogOptions]
    ) -> None:
        for name, values in logs.items():
            both = options[name].on_epoch
            if both:
                self.both.add(name)
            for member in range(self.count):
                if self.stopped_in[member] is None:
                    self.metrics[member][f"{name}_step" if both else name] = values[member]

    def stopped(self, stop: torch.Tensor, epoch: int) -> torch.Tensor:
        """The members ``stop`` names stopped in ``epoch``: what they hold now is final."""
        for member in range(self.count):
            if bool(stop[member]) and self.stopped_in[member] is None:
                self.stopped_in[member] = epoch
        return stop

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        for member in range(self.count):
            if self.stopped_in[member] is None:
                for name, values in means.items():
                    self.metrics[member][name] = values[member]
        return torch.zeros(self.count, dtype=torch.bool)

    def train_epoch_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> None:
        for member in range(self.count):
            if not self._open(member, epoch):
                continue
            for name, values in means.items():
                if name in self.both:
                    self.metrics[member][f"{name}_epoch"] = values[member]
                self.metrics[member][name] = values[member]
