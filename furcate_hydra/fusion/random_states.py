"""The random-number states a fit draws from, saved and put back: torch's, CUDA's, numpy's
and Python's global streams, and the generators of a DataLoader and its samplers.

Lightning's checkpoint holds none of them, so a resumed fit would draw other dropout masks,
other augmentations and another data order than the uninterrupted one from the same point on;
a fused group's members must end with the states their own runs end with. They are kept as
tensors, numbers and strings only: every checkpoint of the fit carries them (the app's own
too), and ``torch.load(weights_only=True)``, Lightning's default when an app loads one,
refuses anything else (numpy's state is an ndarray).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = [
    "StreamsKept",
    "capture_rng",
    "capture_streams",
    "loader_generators",
    "moved_streams",
    "numpy_state",
    "restore_rng",
    "restore_streams",
]


def capture_rng() -> dict[str, Any]:
    """torch's CPU generator, every CUDA device's (only if CUDA is in use: reading them would
    initialise it), numpy's global one and Python's ``random``."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": numpy_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` took (or those of its states ``states`` holds); a CUDA
    state is applied only where CUDA is in use with as many devices as when it was taken (a
    job sees one GPU, on any machine)."""
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        kind, keys, *rest = states["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    if "python" in states:
        random.setstate(states["python"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def numpy_state() -> tuple[Any, ...]:
    """numpy's global state as tensors and numbers (reading it costs ~50 us)."""
    state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    kind, keys, position, has_gauss, cached = state
    return (
        str(kind),
        torch.from_numpy(keys.astype(np.int64)),
        int(position),
        int(has_gauss),
        float(cached),
    )


def loader_generators(*loaders: Any) -> list[torch.Generator]:
    """The generators the loaders' epochs may draw from, each once, in the loaders' order:
    a loader's own, its sampler's, its batch sampler's sampler's (None: no loader). One order
    for every list of them, so that the states ``capture_streams`` took fit back."""
    found = []
    for loader in loaders:
        if loader is None:
            continue
        batch_sampler = getattr(loader, "batch_sampler", None)
        holders = [loader, getattr(loader, "sampler", None), batch_sampler]
        holders.append(getattr(batch_sampler, "sampler", None))
        found += [getattr(holder, "generator", None) for holder in holders if holder is not None]
    return list({id(g): g for g in found if isinstance(g, torch.Generator)}.values())


def moved_streams(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    """Which global streams moved between two ``capture_rng`` readings (of those both hold)."""
    moved = []
    for kind in ("torch", "numpy", "python"):
        if kind not in before or kind not in after:
            continue
        mine, theirs = before[kind], after[kind]
        if kind == "torch":
            same = torch.equal(mine, theirs)
        elif kind == "numpy":  # (kind, keys, position, has_gauss, cached)
            same = torch.equal(mine[1], theirs[1]) and mine[2:] == theirs[2:]
        else:
            same = mine == theirs
        if not same:
            moved.append(kind)
    return tuple(moved)


def capture_streams(generators: list[torch.Generator]) -> dict[str, Any]:
    """The global streams and ``generators``' states: what a fit's data and steps draw from."""
    return {"rng": capture_rng(), "generators": [g.get_state() for g in generators]}


def restore_streams(states: dict[str, Any], generators: list[torch.Generator]) -> None:
    """Put back what ``capture_streams`` took (``generators`` in the same order)."""
    restore_rng(states["rng"])
    for generator, state in zip(generators, states.get("generators", []), strict=False):
        generator.set_state(state)


class StreamsKept:
    """A block after which every global stream and ``generators`` are as before it: reading a
    dataset to compare or probe it must not draw what the training would have drawn."""

    def __init__(self, generators: list[torch.Generator] | None = None) -> None:
        self.generators = generators or []
        self.before: dict[str, Any] = {}

    def __enter__(self) -> StreamsKept:
        self.before = capture_streams(self.generators)
        return self

    def __exit__(self, *exc: object) -> None:
        restore_streams(self.before, self.generators)
