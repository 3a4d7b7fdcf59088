"""Exact resume: where in its epoch training is, the data's draws and the random-number states.

    fit ──► ExactResume.attach(trainer): the train DataLoader is followed when Lightning asks
            for it (``follow``: the app's own loader, whether from fit's arguments, a datamodule
            or the module's own train_dataloader())
    save ──► state_dict(): (epoch, batch) training continues at, the random states now, and
             within an epoch what replays it (the states its iterator was made from, and
             those its next batch is loaded from)
    resume ──► load_state_dict() (before Lightning sets up the data) ──► the followed loader's
               first iterator replays the epoch up to (epoch, batch) ──► on_train_start (the
               sanity check is over) ──► the checkpoint's random states put back: the next
               batch draws what it would have drawn without the interruption

Lightning saves and restores the model, the optimizers and its loops' counters itself.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from furcate_hydra.fusion.random_states import capture_rng, restore_rng
from furcate_hydra.known_warnings import ignore_lightning_mid_epoch_resume
from furcate_hydra.lightning import _epoch_results as epoch_results
from furcate_hydra.lightning._loader_replay import LoaderFollower, Resume, follow
from furcate_hydra.lightning._namespace import CallbackBase

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ExactResume", "ResumeNotExactWarning", "batches_done", "run_seed"]

log = logging.getLogger(__name__)


class ResumeNotExactWarning(UserWarning):
    """The training data cannot resume mid-epoch: a resumed job repeats its epoch's start."""


class _ResumableRequest:
    """The fit loop's request for the train loader, answered with it followed. A class, not a
    closure: ``ddp_spawn`` pickles the Trainer, its data source with it, into each rank."""

    def __init__(self, resume: ExactResume, request: Callable[[], Any]) -> None:
        self.resume = resume
        self.request = request

    def __call__(self) -> Any:
        loader = self.request()
        self.resume._follow(loader)
        return loader


class ExactResume(CallbackBase):
    """Follow the train data and carry its position and the random states in checkpoints.

    Args:
        seed: The run's seed (``torch.initial_seed()``, which ``seed_everything`` sets), kept
            in its checkpoints for the record. The data's order is the app's own.
        warn_if_not_exact: Warn when the data cannot resume mid-epoch (step checkpoints were
            asked for); otherwise the reason is logged at INFO, and a stop mid-epoch warns.
    """

    def __init__(self, seed: int, warn_if_not_exact: bool = False) -> None:
        self.seed = seed
        self.warn_if_not_exact = warn_if_not_exact
        self.follower: LoaderFollower | None = None
        self.not_exact: str | None = None
        self._trainer: pl.Trainer | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def restored_untrained(self) -> bool:
        """Whether fit restored a checkpoint and then trained nothing (it had no epoch left)."""
        return self._pending is not None

    @property
    def resumable(self) -> bool:
        """Whether the train data can resume mid-epoch (known once fit set up its data)."""
        return self.follower is not None

    def attach(self, trainer: pl.Trainer) -> None:
        """Follow the train DataLoader whenever Lightning asks its source for it.

        Lightning keeps the train data's source on its fit loop and calls its ``dataloader()``
        inside ``Trainer.fit``; that call is the one place that sees the loader of every way a
        user can pass one, before Lightning starts iterating it.
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

    def _follow(self, loader: Any) -> None:
        # each rank's DistributedSampler is put in afterwards, by Lightning, in a loader made
        # again of this one's class: followed too
        result = follow(loader)
        if isinstance(result, str):
            self.follower, self.not_exact = None, result
            self._say_not_exact()
            return
        self.follower, self.not_exact = result, None
        ignore_lightning_mid_epoch_resume()
        pending = self._pending
        if pending is not None and pending.get("epoch") is not None:
            result.resume_at(_resume_of(pending))

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
        follower = self.follower
        states = follower.states() if follower is not None else {"rng": capture_rng()}
        state: dict[str, Any] = {"seed": self.seed, **states}
        trainer = self._trainer
        if trainer is not None and follower is not None:
            state["epoch"], state["batch"] = _position(trainer)
            state.update(follower.checkpoint_part(state["epoch"], state["batch"]))
            if state["batch"]:  # what the epoch logged so far, for its epoch values
                state["epoch_results"], left = epoch_results.capture(trainer)
                if left:
                    state["epoch_results_left"] = left
        return _of_every_rank(state)

    def epoch_end_state(self, streams: dict[str, Any], epochs_done: int) -> dict[str, Any]:
        """This callback's state in a checkpoint taken at the end of ``epochs_done`` epochs
        elsewhere (a fused group's), whose random states were ``streams`` then."""
        return {"seed": self.seed, **streams, "epoch": epochs_done, "batch": 0}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ranks = state_dict.get("ranks")
        rank = self._trainer.global_rank if self._trainer is not None else 0
        if ranks and rank < len(ranks):  # a distributed job's: this rank's own
            state_dict = ranks[rank]
        self.seed = int(state_dict.get("seed", self.seed))
        self._pending = dict(state_dict)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None or "rng" not in pending:
            return
        follower = self.follower
        at_epoch_start = not pending.get("batch")
        if follower is not None and follower.resumed and at_epoch_start:
            return  # the epoch's iterator started from these states, which have run on since
        if follower is not None and "epoch_results" in pending:
            epoch_results.restore(trainer, pending["epoch_results"])
            if pending.get("epoch_results_left"):
                warnings.warn(
                    "furcate: resumed mid-epoch, the epoch values of "
                    f"{', '.join(pending['epoch_results_left'])} (torchmetrics objects, whose "
                    "state a checkpoint does not hold) cover the batches after the resume only",
                    ResumeNotExactWarning,
                    stacklevel=2,
                )
        if follower is not None:
            follower.put_back(pending)
        else:
            restore_rng(pending["rng"])


def _of_every_rank(state: dict[str, Any]) -> dict[str, Any]:
    """``state``, and in a distributed job each rank's under ``ranks``: Lightning writes rank
    0's checkpoint only, and each rank's data and random states are its own. Every rank saves
    (Lightning builds the checkpoint on each), so every rank takes part in the gathering."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return state
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return {**state, "ranks": gathered}


def _resume_of(pending: dict[str, Any]) -> Resume:
    """Where the followed loader resumes, from a checkpoint's state."""
    epoch, batch = int(pending["epoch"]), int(pending.get("batch") or 0)
    start = pending.get("start")
    if batch and start is None:  # saved by an earlier furcate, with an order of its own
        warnings.warn(
            "furcate: this checkpoint does not hold the draws of its epoch's data: the epoch "
            "resumes with another order than it started with",
            ResumeNotExactWarning,
            stacklevel=3,
        )
    return Resume(epoch, batch, start or pending, pending.get("before"))


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
