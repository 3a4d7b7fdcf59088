"""A batch shaped as a loader's, for a probe or a timing, drawn from nothing: read from its
dataset without its sampler, since iterating the loader would draw from the random streams
its epochs draw from (the global one, or the sampler's generator) and change the order a
member sees."""

from __future__ import annotations

from typing import Any


def sample_batch(loader: Any) -> Any:
    """A batch shaped as the loader's, read from its dataset without its sampler: iterating
    the loader would draw from the random streams its epochs draw from (None where it is not
    a DataLoader over a dataset that can be indexed)."""
    size = getattr(loader, "batch_size", None)
    dataset: Any = getattr(loader, "dataset", None)
    collate = getattr(loader, "collate_fn", None)
    if not size or collate is None or not hasattr(dataset, "__len__"):
        return None
    try:
        return collate([dataset[i] for i in range(min(size, len(dataset)))])
    except (TypeError, IndexError, KeyError):
        return None
