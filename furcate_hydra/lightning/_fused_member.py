"""A member of a fused group ends its ``fit`` as its own run would have.

The group's leader trained it and sent its end (``fusion.coordinator.Trained``): its own
Lightning checkpoint and its final callback metrics. The member's own ``Trainer.fit`` then
restores that checkpoint (weights, optimizer and scheduler states, loop counters, its
callbacks' states) with its epochs capped where its training ended, so Lightning finds
nothing left to train and returns; the Trainer then holds what the app reads after ``fit``:
``current_epoch``, ``global_step``, its optimizers, ``callback_metrics``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from furcate_hydra.fusion.coordinator import Trained


def finish_trained(
    fit: Callable[..., Any],
    trainer: Any,
    model: Any,
    end: Trained,
    *args: Any,
    **kwargs: Any,
) -> None:
    """Run Lightning's own ``fit`` (``fit``: the Trainer's unwrapped method) over ``end``'s
    checkpoint: every state restored, no batch trained; then the member's final metrics."""
    handle, name = tempfile.mkstemp(prefix="furcate-fused-", suffix=".ckpt")
    os.close(handle)
    path = Path(name)
    loop = trainer.fit_loop
    saved = loop.max_epochs, trainer.num_sanity_val_steps
    try:
        torch.save(end.checkpoint, path)
        # where its training ended: a member its early stopping stopped has no epoch left
        loop.max_epochs = int(end.checkpoint["epoch"])
        trainer.num_sanity_val_steps = 0  # nothing to check: it trained already
        kwargs["ckpt_path"] = str(path)
        fit(trainer, model, *args, **kwargs)
    finally:
        loop.max_epochs, trainer.num_sanity_val_steps = saved
        path.unlink(missing_ok=True)
    # Lightning keeps no metrics in a checkpoint: what the member's run ended with, by the
    # names its callback_metrics would hold them
    trainer._logger_connector._callback_metrics.update(end.callback_metrics)
