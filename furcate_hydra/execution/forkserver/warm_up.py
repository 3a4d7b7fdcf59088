"""What the fork server loads before its first fork: the preloads, and the context it forks from.

A fork of the launcher has most of it already and imports only the preloads it lacks; a new
interpreter imports them all, then unpickles the context (which imports the task's module).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from typing import Any

from furcate_hydra.execution.forkserver.protocol import WarmContext

__all__ = ["import_preloads", "refuse_initialised_cuda", "use_context"]


def import_preloads(names: Iterable[str]) -> list[str]:
    """Import each of ``names`` this process lacks and that is installed; those it imported."""
    return [name for name in names if name not in sys.modules and _import_if_installed(name)]


def use_context(context: WarmContext, collect: bool) -> WarmContext:
    """``context`` prepared, and everything loaded so far frozen."""
    context.prepare()
    # torch and Lightning leave ~400k objects behind. Frozen, they are never scanned again:
    # a job's first full collection no longer walks them (200+ ms), and no collection
    # touches their pages, so they stay shared with the server instead of being copied.
    if collect:
        gc.collect()
    gc.freeze()
    return context


def refuse_initialised_cuda() -> None:
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is initialised in the fork server (by the task's module or a preloaded one, "
            "as they were imported); forked jobs could not use their GPU. Fix: do not touch "
            "CUDA (e.g. torch.cuda.* or .cuda()) at import time of the task's module."
        )


def _import_if_installed(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    importlib.import_module(name)
    return True
