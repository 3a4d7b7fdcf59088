"""Exact resume: where in its epoch training is, the data's order and the random-number states.

    fit ──► ExactResume.attach(trainer): the train DataLoader is remade resumable when Lightning
            asks for it (make_resumable), whether it came from fit's arguments, a datamodule or
            the module's own train_dataloader()
    save ──► state_dict(): seed, (epoch, batch) training continues at, dataset size, RNG states
    resume ──► load_state_dict() (before Lightning sets up the data) ──► the remade loader
               resumes at (epoch, batch) ──► on_train_start (its iterator exists, the sanity
               check is over) ──► the RNG states put back: the next batch draws what it would
               have drawn without the interruption

Lightning saves and restores the model, the optimizers and its loops' counters itself.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from furcate_hydra.known_warnings import ignore_lightning_mid_epoch_resume
from furcate_hydra.lightning._namespace import PYTORCH_LIGHTNING, CallbackBase, namespace_of
from furcate_hydra.lightning._resumable_data import ResumableBatchSampler, make_resumable
from furcate_hydra.lightning._rng import capture_rng, restore_rng

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ExactResume", "ResumeNotExactWarning", "batches_done", "run_seed"]

log = logging.getLogger(__name__)


class ResumeNotExactWarning(UserWarning):
    """The training data cannot resume mid-epoch: a resumed job repeats its epoch's start."""


class _ResumableRequest:
    """The fit loop's request for the train loader, answered with it made resumable. A class,
    not a closure: ``ddp_spawn`` pickles the Trainer, its data source with it, into each rank."""

    def __init__(self, resume: ExactResume, request: Callable[[], Any]) -> None:
        self.resume = resume
        self.request = request

    def __call__(self) -> Any:
        return self.resume._remake(self.request())


class ExactResume(CallbackBase):
    """Make the train data resumable and carry its position and the RNG states in checkpoints.

    Args:
        seed: Seeds the data order (the run's seed: ``torch.initial_seed()``, which
            ``seed_everything`` sets). A resumed run keeps the seed it was saved with.
        warn_if_not_exact: Warn when the data cannot resume mid-epoch (step checkpoints were
            asked for); otherwise the reason is logged at INFO, and a stop mid-epoch warns.
    """

    def __init__(self, seed: int, warn_if_not_exact: bool = False) -> None:
        self.seed = seed
        self.warn_if_not_exact = warn_if_not_exact
        self.batches: ResumableBatchSampler | None = None
        self.not_exact: str | None = None
        self._trainer: pl.Trainer | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def resumable(self) -> bool:
        """Whether the train data was made resumable (known once fit set up its data)."""
        return self.batches is not None

    def attach(self, trainer: pl.Trainer) -> None:
        """Remake the train DataLoader whenever Lightning asks its source for it.

        Lightning keeps the train data's source on its fit loop and calls its ``dataloader()``
        inside ``Trainer.fit``; that call is the one place that sees the loader of every way a
        user can pass one, before Lightning adds its own sampler logic and starts iterating.
        """
        self._trainer = trainer
        source = getattr(trainer.fit_loop, "_data_source", None)
        request: Callable[[], Any] | None = getattr(source, "dataloader", None)
        if source is None or not callable(request):
            self.not_exact = "this Lightning version does not let fit reach the train data"
            return
        if isinstance(request, _ResumableRequest):
            return  # attached already (a fused group's member that then fits alone)
        source.dataloader = _ResumableRequest(self, request)

    def _remake(self, loader: Any) -> Any:
        if self._trainer is not None and self._trainer.world_size > 1:
            # Lightning puts its DistributedSampler in afterwards, which ours cannot carry
            result: ResumableBatchSampler | str = "is split across processes (distributed)"
            remade = loader
        else:
            namespace = namespace_of(self._trainer)
            remade, result = make_resumable(loader, self.seed, str(namespace or PYTORCH_LIGHTNING))
        if isinstance(result, str):
            self.batches, self.not_exact = None, result
            self._say_not_exact()
            return loader
        self.batches, self.not_exact = result, None
        ignore_lightning_mid_epoch_resume()
        pending = self._pending
        if pending is not None and pending.get("batch") is not None:
            if pending.get("dataset_size") == len(result.order_sampler):
                result.resume_at(int(pending["epoch"]), int(pending["batch"]))
            else:
                warnings.warn(
                    f"furcate: the training dataset has {len(result.order_sampler)} samples, "
                    f"its checkpoint was saved with {pending.get('dataset_size')}: the data "
                    "order cannot continue where it stopped",
                    ResumeNotExactWarning,
                    stacklevel=2,
                )
        return remade

    def _say_not_exact(self) -> None:
        message = (
            f"furcate: training cannot resume mid-epoch exactly: the train DataLoader "
            f"{self.not_exact}. Checkpoints are taken at epoch ends only, and a resumed job "
            "starts its interrupted epoch over."
        )
        if self.warn_if_not_exact:
            warnings.warn(message, ResumeNotExactWarning, stacklevel=2)
        else:
            log.info(message)

    # -- the checkpoint's part -----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"seed": self.seed, "rng": capture_rng()}
        trainer = self._trainer
        if trainer is not None and self.batches is not None:
            state["epoch"], state["batch"] = _position(trainer)
            state["dataset_size"] = len(self.batches.order_sampler)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = int(state_dict.get("seed", self.seed))
        self._pending = dict(state_dict)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and "rng" in pending:
            restore_rng(pending["rng"])


def batches_done(trainer: pl.Trainer) -> int:
    """How many batches of the current epoch were trained (their step taken)."""
    # the loop's progress is a _BatchProgress whose `current` counts processed batches too
    current: Any = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(current.processed)


def _position(trainer: pl.Trainer) -> tuple[int, int]:
    """(epoch, batch) training continues at after the batch or epoch that just ended."""
    done = batches_done(trainer)
    if done >= trainer.num_training_batches:
        return trainer.current_epoch + 1, 0
    return trainer.current_epoch, done


def run_seed() -> int:
    """The seed of this process's torch generator: ``seed_everything``'s, or a random one."""
    return int(torch.initial_seed())
