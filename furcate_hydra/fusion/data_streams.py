"""The random streams a group's data draws from, kept at the start of its training and put
back before each further part of it: a group trained in parts (a learned width narrower than
the group) must show every part the batches, in the order, each member's own run would see.

What a shuffled ``DataLoader`` draws from: the global torch stream, or the generator of its
sampler or of the loader itself. (The other streams a training step might draw from are the
signature's to refuse, not this module's.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class DataStreams:
    """The states of the streams a group's loaders draw from, as they were when taken."""

    global_state: torch.Tensor
    generators: list[tuple[torch.Generator, torch.Tensor]]

    @classmethod
    def taken(cls, loaders: Iterable[Any]) -> DataStreams:
        generators = {id(g): g for loader in loaders for g in loader_generators(loader)}
        return cls(torch.get_rng_state(), [(g, g.get_state()) for g in generators.values()])

    def put_back(self) -> None:
        torch.set_rng_state(self.global_state)
        for generator, state in self.generators:
            generator.set_state(state)


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a loader's order may draw from, each once: its own, its sampler's, its
    batch sampler's sampler's."""
    if loader is None:
        return []
    holders = [loader, getattr(loader, "sampler", None)]
    batch_sampler = getattr(loader, "batch_sampler", None)
    holders += [batch_sampler, getattr(batch_sampler, "sampler", None)]
    found = [getattr(holder, "generator", None) for holder in holders if holder is not None]
    return list({id(g): g for g in found if isinstance(g, torch.Generator)}.values())
