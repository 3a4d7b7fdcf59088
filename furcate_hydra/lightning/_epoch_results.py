"""What an epoch has logged so far, carried in a checkpoint taken within it.

Lightning accumulates each value logged ``on_epoch`` over the epoch's batches (a mean weighted
by batch size, a sum, a max, a min) and keeps none of it in a checkpoint: a run resumed
mid-epoch would report the mean of the batches after the resume only. A checkpoint within an
epoch holds each accumulated value (``capture``); the resume puts them back before its first
batch (``restore``), so the epoch's values are those of the uninterrupted run. A value logged
as a torchmetrics ``Metric`` keeps its own state, which this does not carry (``capture`` says
so).
"""

from __future__ import annotations

from typing import Any

__all__ = ["capture", "restore"]

_META = ("fx", "name", "prog_bar", "logger", "on_step", "on_epoch", "add_dataloader_idx")


def capture(trainer: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The training epoch's accumulated values (tensors and plain values only), and the names
    of those it cannot carry."""
    results = getattr(trainer.fit_loop.epoch_loop, "_results", None) or {}
    carried, left = [], []
    for key, metric in results.items():
        sync = metric.meta.sync
        if not getattr(metric, "is_tensor", False) or sync._group is not None:
            left.append(metric.meta.name)  # a Metric's own state; a process group object
            continue
        entry: dict[str, Any] = {name: getattr(metric.meta, name) for name in _META}
        entry.update(key=key, reduce_fx=metric.meta.reduce_fx.__name__)
        entry.update(sync_dist=bool(sync.should), rank_zero_only=bool(sync.rank_zero_only))
        entry["value"] = metric.value.detach().clone()
        if metric.meta.is_mean_reduction:
            entry["cumulated_batch_size"] = metric.cumulated_batch_size.detach().clone()
        carried.append(entry)
    return carried, left


def restore(trainer: Any, carried: list[dict[str, Any]]) -> None:
    """Put ``capture``'s values back into the training epoch's results."""
    results = trainer.fit_loop.epoch_loop._results
    # not the epoch's first batch: Lightning clears a hook's epoch values at its first log
    # in an epoch's first batch only
    trainer._logger_connector._first_loop_iter = True
    for entry in carried:
        value = entry["value"].clone()
        options = {name: entry[name] for name in _META[2:]}
        # as LightningModule.log passes them: the metadata must be equal to the step's own
        results.log(
            entry["fx"],
            entry["name"],
            value,
            reduce_fx=entry["reduce_fx"],
            sync_dist=entry.get("sync_dist", False),
            sync_dist_fn=trainer.strategy.reduce,
            rank_zero_only=entry.get("rank_zero_only", False),
            **options,
        )
        metric = results[entry["key"]]
        metric.value = value
        if "cumulated_batch_size" in entry:
            metric.cumulated_batch_size = entry["cumulated_batch_size"].clone()
