"""How far one member has trained, counted as Lightning's fit loop counts it: what its own
checkpoint's loop state holds (``member_checkpoint``) and where it resumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MemberProgress:
    """A member's counts: all of its training, and within its latest epoch."""

    epochs: int = 0  # epochs completed
    steps: int = 0  # optimizer steps (Lightning's global_step)
    batches: int = 0
    scheduler_steps: int = 0
    batches_in_epoch: int = 0
    steps_in_epoch: int = 0
    scheduler_steps_in_epoch: int = 0
    val_batches: int = 0  # in its latest validation

    def epoch_started(self) -> None:
        self.batches_in_epoch = self.steps_in_epoch = self.scheduler_steps_in_epoch = 0

    def batch_done(self, stepped: bool) -> None:
        self.batches += 1
        self.batches_in_epoch += 1
        if stepped:
            self.steps += 1
            self.steps_in_epoch += 1

    def schedulers_stepped(self, count: int) -> None:
        self.scheduler_steps += count
        self.scheduler_steps_in_epoch += count

    def validated(self, batches: int) -> None:
        self.val_batches = batches
