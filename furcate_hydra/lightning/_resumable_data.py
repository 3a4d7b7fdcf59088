"""A training DataLoader whose order, and whose workers' random draws, can resume mid-epoch.

    DataLoader(dataset, shuffle=True, num_workers=N)            (what the user wrote)
      ──► same class, same arguments, but
            batch_sampler = ResumableBatchSampler(ResumableSampler(len(dataset), shuffle, seed))
            generator     = its own (iterators no longer draw from torch's global generator)
      epoch e's order: a permutation seeded by (seed, e); resume_at(e, k) starts at batch k
      batch b of epoch e: a worker reseeds torch, numpy and random from (seed, e, b) first

Lightning swaps a DistributedSampler in the same way (``_update_dataloader``). What cannot be
swapped (iterable datasets, custom samplers or batch samplers, sampling with replacement) is
left as it is, with the reason, and resumes at the epoch boundary.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

from furcate_hydra.lightning._namespace import PYTORCH_LIGHTNING

__all__ = ["ResumableBatchSampler", "ResumableSampler", "make_resumable"]


def mix_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``: the same on every machine and in every process."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class ResumableSampler(Sampler[int]):
    """Every index of a map-style dataset once per epoch: shuffled by (seed, epoch), or in
    order. Draws nothing from the global generators, so it depends on nothing else."""

    def __init__(self, size: int, shuffle: bool, seed: int) -> None:
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at each epoch's start, as for a DistributedSampler."""
        self.epoch = epoch

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator().manual_seed(mix_seed(self.seed, "order", self.epoch))
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order())

    def __len__(self) -> int:
        return self.size


class SeededBatch(list[int]):
    """A batch's indices, and the seed a DataLoader worker reseeds from before loading them.

    Which worker loads a batch, and what it drew before, depend on where the iterator started;
    reseeding per batch makes a batch's augmentations depend on (seed, epoch, batch) only. The
    worker's fetcher iterates the batch to load each sample, so that is where it reseeds.
    """

    seed: int

    def __iter__(self) -> Iterator[int]:
        if get_worker_info() is not None:  # the main process keeps its own, restored, stream
            torch.manual_seed(self.seed)
            random.seed(self.seed)
            np.random.seed(self.seed % 2**32)
        return super().__iter__()


class ResumableBatchSampler(BatchSampler):
    """``BatchSampler`` over a :class:`ResumableSampler` that can start an epoch at batch k."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.order_sampler = sampler
        self._resume: tuple[int, int] | None = None

    def resume_at(self, epoch: int, batch: int) -> None:
        """The next iteration is epoch ``epoch``'s, from its batch ``batch`` (0-based) on."""
        self.order_sampler.set_epoch(epoch)
        self._resume = (epoch, batch)

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.order_sampler.epoch
        skip = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None  # once: a later iteration of this epoch starts at its beginning
        order = self.order_sampler.order()
        seed = self.order_sampler.seed
        for number in range(skip, len(self)):
            batch = SeededBatch(order[number * self.batch_size : (number + 1) * self.batch_size])
            batch.seed = mix_seed(seed, "batch", epoch, number)
            yield batch


def make_resumable(
    loader: object, seed: int, namespace: str = PYTORCH_LIGHTNING
) -> tuple[Any, ResumableBatchSampler | str]:
    """``loader`` remade with a :class:`ResumableBatchSampler`, or ``loader`` itself and why
    it cannot be (in words, for a warning). ``namespace``: the Trainer's, whose helpers remake
    the loader from the arguments its ``fit`` recorded."""
    if not isinstance(loader, DataLoader):
        return loader, f"it is a {type(loader).__name__}, not one torch DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return loader, "its dataset is an IterableDataset, whose position cannot be restored"
    if type(loader.batch_sampler) is not BatchSampler:
        kind = "no batch size" if loader.batch_sampler is None else "a custom batch sampler"
        return loader, f"it has {kind}"
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler.num_samples != len(loader.dataset):  # type: ignore[arg-type]
            return loader, "its RandomSampler draws with replacement or a set number of samples"
    elif type(sampler) is not SequentialSampler:
        return loader, f"it has a custom sampler ({type(sampler).__name__})"
    batch_size, drop_last = loader.batch_sampler.batch_size, loader.batch_sampler.drop_last
    order = ResumableSampler(len(sampler), isinstance(sampler, RandomSampler), seed)
    batches = ResumableBatchSampler(order, batch_size, drop_last)
    # the Trainer's own helpers, which read the arguments its fit recorded for the loader
    data = importlib.import_module(f"{namespace}.utilities.data")
    training = importlib.import_module(f"{namespace}.trainer.states").RunningStage.TRAINING
    try:
        args, kwargs = data._get_dataloader_init_args_and_kwargs(loader, order, training)
        kwargs.update(
            sampler=None,
            shuffle=False,
            batch_sampler=batches,
            batch_size=1,
            drop_last=False,
            generator=torch.Generator().manual_seed(mix_seed(seed, "loader")),
        )
        return data._reinstantiate_wrapped_cls(loader, *args, **kwargs), batches
    except Exception as exc:  # a DataLoader subclass Lightning cannot remake either
        return loader, f"it cannot be made again with another sampler ({exc})"
