"""The app's own train DataLoader, followed so that a resume mid-epoch replays it exactly.

    fit ──► follow(loader): the same loader object, its sampler, generator and workers as the
            app made them; only its ``__iter__`` is followed (a subclass of its own class):
              each epoch's iterator: the random states it draws from (torch's, numpy's and
              Python's global streams, the loader's and its samplers' generators) noted
              just before it is made (its base seed and its sampler's order come from them);
              in the main process, the states just before each batch is loaded (numpy's
              only where loading was seen to draw from it: reading it costs ~50 us)
    checkpoint in epoch e, k batches trained ──► epoch e's start states, those before batch k
    resume ──► the first iterator: samplers set to epoch e, the start states put back, the
            iterator made (the same base seed, the same order), its first k batches loaded
            and dropped (workers' own streams advance as they did), then the states before
            batch k: batch k loads as it did, and training goes on from the checkpoint's states

Nothing of the app's data is replaced, so an uninterrupted fit draws exactly what the app
alone draws. A loader whose workers persist across epochs keeps streams no checkpoint holds:
it is not followed, and its job resumes at an epoch's start.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from furcate_hydra.fusion.random_states import (
    capture_streams,
    loader_generators,
    moved_streams,
    numpy_state,
    restore_streams,
)

__all__ = ["LoaderFollower", "ReplayNotExactWarning", "Resume", "follow"]

_KEPT_BEFORE = 4  # states kept of the latest batches loaded (Lightning fetches one ahead)


class ReplayNotExactWarning(UserWarning):
    """A resume cannot replay the data exactly as it was drawn."""


@dataclass(frozen=True)
class Resume:
    """Where the next iterator resumes: ``batch`` batches of ``epoch`` were trained; ``start``:
    the states that epoch's iterator was made from; ``before``: those batch ``batch`` was
    loaded from (None: it is loaded after the checkpoint's states are back)."""

    epoch: int
    batch: int
    start: dict[str, Any]
    before: dict[str, Any] | None = None


class LoaderFollower:
    """What one DataLoader's epochs drew, noted as the app's fit iterates it."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.generators = loader_generators(loader)
        self.in_workers = loader.num_workers > 0
        self.epoch_start: dict[str, Any] | None = None
        self.loaded = 0  # batches the current epoch's iterator has handed out
        self._before: dict[int, dict[str, Any]] = {}
        self._resume: Resume | None = None
        self.resumed = False  # a resume was replayed by an iterator
        self.numpy_drawn = False  # loading a batch was seen to draw from numpy's stream

    def states(self) -> dict[str, Any]:
        """Every random state the loader's epochs draw from, as tensors and plain values."""
        return capture_streams(self.generators)

    def put_back(self, states: dict[str, Any]) -> None:
        restore_streams(states, self.generators)

    def resume_at(self, resume: Resume) -> None:
        """The next iterator replays ``resume``."""
        self._resume = resume

    def checkpoint_part(self, epoch: int, batch: int) -> dict[str, Any]:
        """What a checkpoint taken with ``batch`` batches of ``epoch`` trained must hold to
        replay them (nothing at an epoch's start: the checkpoint's own states start it)."""
        if batch == 0 or self.epoch_start is None:
            return {}
        part: dict[str, Any] = {"start": self.epoch_start}
        before = self._before.get(batch)
        if before is not None:
            part["before"] = before
        return part

    def iterate(self, loader: Any, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The epoch's iterator of ``loader`` (the app's, or the one Lightning made of it for
        its rank), made by ``make`` (the loader's own ``__iter__``)."""
        if loader is not self.loader:
            self.loader, self.generators = loader, loader_generators(loader)
            self.in_workers = loader.num_workers > 0
        resume, self._resume = self._resume, None
        if resume is not None:
            # at a resume Lightning makes the iterator before it sets the samplers' epoch
            _set_epoch(self.loader, resume.epoch)
            self.put_back(resume.start)
        self.epoch_start = self.states()
        self.loaded = 0
        self._before = {}
        iterator = _FollowedIterator(make(), self)
        if resume is not None:
            self.resumed = True
            self._replay(iterator, resume)
        return iterator

    def _replay(self, iterator: _FollowedIterator, resume: Resume) -> None:
        for _ in range(resume.batch):
            try:
                next(iterator)
            except StopIteration:
                warnings.warn(
                    f"furcate: the training data gave fewer than the {resume.batch} batches of "
                    f"epoch {resume.epoch} its checkpoint had trained: it changed since",
                    ReplayNotExactWarning,
                    stacklevel=2,
                )
                return
        if resume.before is not None:
            self.put_back(resume.before)

    def load(self, inner: Iterator[Any]) -> Any:
        """The next batch of ``inner``, noting the states it is loaded from (in this process,
        unless workers load it)."""
        number = self.loaded
        self.loaded += 1
        if self.in_workers:
            return next(inner)
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        # each epoch's first batch tells whether loading draws from numpy's stream
        numpy_before = numpy_state() if self.numpy_drawn or number == 0 else None
        if self.numpy_drawn:
            rng["numpy"] = numpy_before
        generators = [g.get_state() for g in self.generators]
        self._before[number] = {"rng": rng, "generators": generators}
        self._before.pop(number - _KEPT_BEFORE, None)
        batch = next(inner)
        first = number == 0 and not self.numpy_drawn
        if first and moved_streams({"numpy": numpy_before}, {"numpy": numpy_state()}):
            self.numpy_drawn = True
            rng["numpy"] = numpy_before
        return batch


class _FollowedIterator:
    """The loader's iterator, telling its follower before each batch."""

    def __init__(self, inner: Iterator[Any], follower: LoaderFollower) -> None:
        self.inner = inner
        self.follower = follower

    def __iter__(self) -> _FollowedIterator:
        return self

    def __next__(self) -> Any:
        return self.follower.load(self.inner)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def follow(loader: Any) -> LoaderFollower | str:
    """``loader`` followed from now on (its follower), or why it cannot be, in words. A
    loader Lightning makes again from it (each rank's, with its distributed sampler) is of
    its class, and followed by the same follower."""
    if not isinstance(loader, DataLoader):
        return f"it is a {type(loader).__name__}, not a torch DataLoader"
    if loader.num_workers > 0 and loader.persistent_workers:
        return "its workers persist across epochs (persistent_workers=True), with their streams"
    existing = getattr(type(loader), "_furcate_follower", None)
    if isinstance(existing, LoaderFollower):
        return existing
    follower = LoaderFollower(loader)
    loader.__class__ = _followed_class(type(loader), follower)
    return follower


def _followed_class(base: Any, follower: LoaderFollower) -> type:
    """``base`` with its ``__iter__`` followed by ``follower``: one class per fit."""

    def __iter__(self: Any) -> Iterator[Any]:
        make: Callable[[], Iterator[Any]] = super(followed, self).__iter__  # type: ignore[arg-type]
        return follower.iterate(self, make)

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        # pickled as the app's own class: the follower belongs to this process's fit
        return _rebuilt, (base, dict(self.__dict__))

    followed = type(
        base.__name__,
        (base,),
        {
            "__iter__": __iter__,
            "__reduce_ex__": __reduce_ex__,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "_furcate_follower": follower,
        },
    )
    return followed


def _rebuilt(base: Any, state: dict[str, Any]) -> Any:
    loader = base.__new__(base)
    loader.__dict__.update(state)
    return loader


def _set_epoch(loader: Any, epoch: int) -> None:
    """Lightning's own rule (``_set_sampler_epoch``): the batch sampler's and the sampler's
    ``set_epoch``, each object once."""
    holders = (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None))
    for holder in {id(h): h for h in holders if h is not None}.values():
        set_epoch = getattr(holder, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
