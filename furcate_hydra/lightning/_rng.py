"""The random-number states that dropout and augmentation draw from, saved and put back.

Lightning's checkpoint holds none of them, so a resumed fit would draw other dropout masks and
other augmentations than the uninterrupted one from the same point on. They are kept as
tensors, numbers and strings only: every checkpoint of the fit carries them (the app's own
too), and ``torch.load(weights_only=True)``, Lightning's default when an app loads one,
refuses anything else (numpy's state is an ndarray).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "numpy_state", "restore_rng"]


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
