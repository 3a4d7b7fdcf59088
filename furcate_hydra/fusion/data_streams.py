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

from furcate_hydra.fusion.random_states import (
    capture_streams,
    loader_generators,
    restore_streams,
)


@dataclass
class DataStreams:
    """The states of the streams a group's data and steps draw from, as they were when taken."""

    generators: list[torch.Generator]
    states: dict[str, Any]

    @classmethod
    def taken(cls, loaders: Iterable[Any]) -> DataStreams:
        generators = loader_generators(*loaders)
        return cls(generators, capture_streams(generators))

    def put_back(self) -> None:
        restore_streams(self.states, self.generators)
