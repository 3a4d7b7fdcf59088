"""Each member's own random states through its group's training, so that every member ends
(and keeps each epoch's end) with the states its own run would have.

A group trains on one set of loaders, which draw from the leader process's streams. Members
whose data draws from the streams (a shuffled order, augmentation, workers) must start from
the same states (``signature``): the live streams are then each one's. A member whose data
draws nothing from them but whose streams differ (another seed, the same unshuffled data)
still has its own run's states move as its loaders make iterators (each iterator draws its
base seed): here each iterator the group makes is made once more, from that member's states,
and dropped, which moves them exactly as torch moves them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from furcate_hydra.fusion.random_states import (
    capture_streams,
    loader_generators,
    restore_streams,
)


class MemberStreams:
    """The states of each member: the live streams, or its own, moved alongside.

    ``drawn``: the global streams the data draws from besides torch's (``numpy``, ``python``:
    its samples draw from them); a member's other streams are as its own run leaves them,
    untouched by training: its own."""

    def __init__(
        self,
        states: Sequence[dict[str, Any] | None],
        loaders: Sequence[Any],
        drawn: Sequence[str] = (),
    ) -> None:
        self.generators = loader_generators(*loaders)
        self.drawn = ("torch", *drawn)
        self.start = list(states)
        first = states[0] if states else None
        # None: the member's states are the live ones, as far as training draws from them
        self.own: list[dict[str, Any] | None] = [
            None
            if state is None or first is None or same_states(state, first, self.drawn)
            else state
            for state in states
        ]
        # the group, or each part of it a learned width trains in turn, trains from its first
        # member's states: every part sees the batches its members' own runs see
        if first is not None:
            restore_streams(first, self.generators)

    def iterate(self, loader: Any) -> Iterator[Any]:
        """``iter(loader)`` from the live streams, and once from each member's own."""
        iterator: Iterator[Any] = iter(loader)
        if any(state is not None for state in self.own):
            live = capture_streams(self.generators)
            for index, state in enumerate(self.own):
                if state is not None:
                    restore_streams(state, self.generators)
                    iter(loader)  # its base seed drawn, as its own run's iterator draws it
                    self.own[index] = capture_streams(self.generators)
            restore_streams(live, self.generators)
        return iterator

    def state_of(self, index: int) -> dict[str, Any]:
        """Member ``index``'s states now: those training draws from, moved as its own run
        moves them; the others as it started."""
        own = self.own[index]
        now = own if own is not None else capture_streams(self.generators)
        start = self.start[index]
        if start is None:
            return now
        rng = dict(start["rng"])
        rng.update({kind: now["rng"][kind] for kind in self.drawn if kind in now["rng"]})
        return {"rng": rng, "generators": now["generators"]}


def same_states(
    first: dict[str, Any], second: dict[str, Any], kinds: Sequence[str] = ("torch",)
) -> bool:
    """Whether two ``capture_streams`` results hold the same generators and ``kinds`` of
    global streams."""
    return digest(first, kinds) == digest(second, kinds)


def digest(states: dict[str, Any], kinds: Sequence[str] = ("torch", "numpy", "python")) -> str:
    """A short digest of ``states``' ``kinds`` of global streams and its generators."""
    hashed = hashlib.sha1()
    rng = states["rng"]
    for kind in kinds:
        value = rng.get(kind)
        if isinstance(value, torch.Tensor):
            hashed.update(value.numpy().tobytes())
        elif kind == "numpy" and value is not None:
            hashed.update(value[1].numpy().tobytes() + str(value[2]).encode())
        elif value is not None:
            hashed.update(repr(value).encode())
    for state in states.get("generators", []):
        hashed.update(state.numpy().tobytes())
    return hashed.hexdigest()[:16]
