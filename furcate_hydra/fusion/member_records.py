"""What each member's loggers and history would have received from its own run.

Lightning hands its loggers a member's values at three points, each at the step count its
fit loop keeps (``_batches_that_stepped``):

- after an optimizer step, when the steps so far are a multiple of ``log_every_n_steps``:
  the values logged on step (``name_step`` where the name is logged on epoch too), at the
  count before that step;
- after validation: its epoch values, at the count before the batch's step (validation runs
  before the count moves on);
- at a training epoch's end: the epoch values of training (``name_epoch`` beside an on-step
  one), at that same count, in a call of its own after validation's (Lightning 2.6's
  CSVLogger writes the three as three rows).

Each adds ``epoch``, an int. A member's history row per epoch is its callback metrics at the
epoch's end (``EpochRecord``). A member stopped early records nothing after its stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from furcate_hydra.fusion.member_stopping import MemberStopping
from furcate_hydra.fusion.step_logs import LogOptions

Logged = tuple[int, dict[str, float | int]]  # (step, metrics) as one logger call gets them


@dataclass(frozen=True)
class EpochRecord:
    """A member's callback metrics at the end of one of its epochs."""

    epoch: int
    step: int
    metrics: dict[str, float]
    validated: bool  # validation ran in this epoch
    validation_names: tuple[str, ...]  # what validation logged, this epoch or before


@dataclass
class MemberLog:
    """One member's logger calls and epoch records, in order."""

    logged: list[Logged] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)


class MemberRecords:
    """A ``FusionObserver`` around ``MemberStopping``: each member's ``MemberLog``.

    ``log_every``: each member's Trainer's ``log_every_n_steps`` (0: no step values).
    """

    def __init__(self, stopping: MemberStopping, log_every: Sequence[int]) -> None:
        self.stopping = stopping
        self.log_every = list(log_every)
        self.logs = [MemberLog() for _ in log_every]
        self._step = 0
        self._stepped = False  # the last batch made an optimizer step
        self._validated = [False] * len(self.logs)
        self._validation_names: list[set[str]] = [set() for _ in self.logs]

    def _log(self, member: int, step: int, values: dict[str, float], epoch: int) -> None:
        """One logger call, with the epoch as Lightning adds it (an int)."""
        self.logs[member].logged.append((step, {**values, "epoch": epoch}))

    def _recording(self, member: int, epoch: int) -> bool:
        stopped = self.stopping.final.stopped_in[member]
        return stopped is None or stopped == epoch

    def train_step(
        self, step: int, epoch: int, logs: dict[str, torch.Tensor], options: dict[str, LogOptions]
    ) -> None:
        self._stepped, self._step = step != self._step, step
        self.stopping.train_step(step, epoch, logs, options)
        if not self._stepped:
            return
        for member, every in enumerate(self.log_every):
            stopped = self.stopping.final.stopped_in[member] is not None
            if every <= 0 or step % every or stopped:  # a stopped member's epoch ends at once
                continue
            values = {
                (f"{name}_step" if options[name].on_epoch else name): float(value[member])
                for name, value in logs.items()
                if options[name].logger
            }
            if values:
                self.logs[member].logged.append((step - 1, {**values, "epoch": epoch}))

    def validation_end(self, step: int, epoch: int, means: dict[str, torch.Tensor]) -> torch.Tensor:
        open_now = [self._recording(m, epoch) for m in range(len(self.logs))]
        stop = self.stopping.validation_end(step, epoch, means)
        at = step - 1 if self._stepped else step
        for member, recording in enumerate(open_now):
            if not recording:
                continue
            self._validated[member] = True
            self._validation_names[member].update(means)
            values = {name: float(value[member]) for name, value in means.items()}
            if values:
                self._log(member, at, values, epoch)
        return stop

    def train_epoch_end(
        self, step: int, epoch: int, means: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        open_now = [self._recording(m, epoch) for m in range(len(self.logs))]
        ended = self.stopping.train_epoch_end(step, epoch, means)
        both = self.stopping.final.both
        for member, recording in enumerate(open_now):
            if not recording:
                continue
            values = {
                (f"{name}_epoch" if name in both else name): float(value[member])
                for name, value in means.items()
            }
            if values:
                self._log(member, step - 1 if self._stepped else step, values, epoch)
            metrics = self.stopping.final.metrics[member]
            self.logs[member].epochs.append(
                EpochRecord(
                    epoch,
                    step,
                    {name: float(value) for name, value in metrics.items() if value.numel() == 1},
                    self._validated[member],
                    tuple(sorted(self._validation_names[member])),
                )
            )
            self._validated[member] = False
        return ended
