"""One member's own Lightning checkpoint, written from a fused fit: what its own run's
``trainer.save_checkpoint`` would hold at the same point, so that a member can resume alone
(``Trainer.fit(ckpt_path=...)``) or be read by anything that reads Lightning checkpoints.

The loop state is Lightning 2's fit loop counters (``fit_loop.state_dict()``) at the end of a
fit, from the member's ``MemberProgress``; a test holds it equal to a real run's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from furcate_hydra.fusion.fused_fit import MemberTraining
from furcate_hydra.fusion.member_progress import MemberProgress

_FOUR = ("ready", "started", "processed", "completed")


def _counts(value: int, keys: tuple[str, ...] = _FOUR) -> dict[str, int]:
    return {key: value for key in keys}


def _batches(total: int, current: int, last: bool) -> dict[str, Any]:
    return {"total": _counts(total), "current": _counts(current), "is_last_batch": last}


def _two(total: int, current: int) -> dict[str, dict[str, int]]:
    pair = ("ready", "completed")
    return {"total": _counts(total, pair), "current": _counts(current, pair)}


def fit_loop_state(progress: MemberProgress) -> dict[str, Any]:
    """Lightning's ``fit_loop.state_dict()`` once a fit of ``progress`` has ended."""
    p = progress
    three = ("ready", "started", "completed")
    return {
        "state_dict": {},
        "epoch_loop.state_dict": {"_batches_that_stepped": p.steps},
        "epoch_loop.batch_progress": _batches(p.batches, p.batches_in_epoch, p.batches > 0),
        "epoch_loop.scheduler_progress": _two(p.scheduler_steps, p.scheduler_steps_in_epoch),
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {
            "optimizer": {
                "step": _two(p.steps, p.steps_in_epoch),
                "zero_grad": {
                    "total": _counts(p.steps, three),
                    "current": _counts(p.steps_in_epoch, three),
                },
            }
        },
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": _two(0, 0),
        "epoch_loop.val_loop.state_dict": {},
        "epoch_loop.val_loop.batch_progress": _batches(
            p.val_batches, p.val_batches, p.val_batches > 0
        ),
        "epoch_progress": {"total": _counts(p.epochs), "current": _counts(p.epochs)},
    }


def _untouched_loops() -> dict[str, Any]:
    """The validate, test and predict loops of a Trainer that only ran ``fit``."""
    fresh = _batches(0, 0, False)
    predict = {"total": _counts(0), "current": _counts(0)}
    return {
        "validate_loop": {"state_dict": {}, "batch_progress": fresh},
        "test_loop": {"state_dict": {}, "batch_progress": fresh},
        "predict_loop": {"state_dict": {}, "batch_progress": predict},
    }


def lightning_checkpoint(
    member: MemberTraining,
    progress: MemberProgress,
    version: str,
    callbacks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint the member's own run would save once its fit ended at ``progress``
    (``version``: the Lightning that writes it; ``callbacks``: its callbacks' states)."""
    checkpoint: dict[str, Any] = {
        "epoch": progress.epochs,
        "global_step": progress.steps,
        "pytorch-lightning_version": version,
        "state_dict": member.module.state_dict(),
        "loops": {"fit_loop": fit_loop_state(progress), **_untouched_loops()},
        "callbacks": callbacks or {},
        "optimizer_states": [member.optimizer.state_dict()],
        "lr_schedulers": [plan.scheduler.state_dict() for plan in member.schedulers],
    }
    hparams = _hyperparameters(member.module)
    if hparams is not None:
        checkpoint["hparams_name"] = "kwargs"
        checkpoint["hyper_parameters"] = hparams
    return checkpoint


def _hyperparameters(module: nn.Module) -> dict[str, Any] | None:
    """What ``save_hyperparameters`` kept, as Lightning writes it (None where nothing was)."""
    hparams = getattr(module, "hparams", None)
    if not hparams:
        return None
    return dict(hparams)
