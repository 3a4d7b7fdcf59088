"""Lightning's private names that furcate's warm DDP ranks use, each read here and nowhere else.

Nothing here imports Lightning: each function reaches the modules of a namespace the job has
already imported. Each name has a test (``tests/test_warm_ranks.py``) that fails, naming it,
when a Lightning release moves it:

    <launchers>._SubprocessScriptLauncher._call_children_scripts
                          starts ranks 1..N-1 of a node (``strategy=ddp``, FSDP; Fabric's
                          ``launch``) with ``subprocess.Popen(command, env=..., cwd=...)``,
                          ``subprocess`` being its module's global: for that call furcate gives
                          the module another ``subprocess``, whose ``Popen`` starts the rank
                          its own way; the command, its environment and its working dir stay
                          Lightning's. <launchers>: ``strategies.launchers.subprocess_script``
                          of ``lightning.pytorch``, ``pytorch_lightning``, ``lightning.fabric``,
                          ``lightning_fabric``
    <fabric>.utilities.rank_zero._get_rank
                          the rank ``rank_zero_only.rank`` starts at when Lightning is
                          imported, read from the environment (LOCAL_RANK for such a rank);
                          <fabric>: ``lightning.fabric``, ``lightning_fabric``

Both are checked when a namespace's launchers are routed: where one has moved, its ranks start
as Lightning starts them, and the job says so.
"""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from furcate_hydra.errors import PrivateApiMoved

__all__ = [
    "LAUNCHER_MODULES",
    "RANK_ZERO_MODULES",
    "LightningPrivateMoved",
    "Popen",
    "fresh_lightning_state",
    "route_rank_processes",
]

# The Lightning releases these names were read from (the job's Lightning, 2.x).
TESTED = "2.6"
# a namespace's subprocess launcher, and its Fabric's (which Fabric's own `launch` uses)
LAUNCHER_MODULES = {
    "lightning.pytorch": (
        "lightning.pytorch.strategies.launchers.subprocess_script",
        "lightning.fabric.strategies.launchers.subprocess_script",
    ),
    "pytorch_lightning": (
        "pytorch_lightning.strategies.launchers.subprocess_script",
        "lightning_fabric.strategies.launchers.subprocess_script",
    ),
}
# where a namespace's Fabric reads the rank a new interpreter starts at
RANK_ZERO_MODULES = {
    "lightning.pytorch": "lightning.fabric.utilities.rank_zero",
    "pytorch_lightning": "lightning_fabric.utilities.rank_zero",
}
_LAUNCHER = "_SubprocessScriptLauncher"
_CALL = "_call_children_scripts"
_ROUTED = "_furcate_routed"  # on a wrapped _call_children_scripts

# what starts one rank: Lightning's call, ``Popen(command, env=..., cwd=...)``
Popen = Callable[..., Any]


class LightningPrivateMoved(PrivateApiMoved):
    """A Lightning release no longer has a private name furcate reads."""

    def __init__(self, name: str, problem: str) -> None:
        package = sys.modules.get("lightning") or sys.modules.get("pytorch_lightning")
        version = str(getattr(package, "__version__", "?"))
        super().__init__("Lightning", "lightning", version, TESTED, name, problem)


def route_rank_processes(namespace: str, popen_for_call: Callable[[], Popen]) -> None:
    """From now on, each time a subprocess launcher of ``namespace`` (imported) starts its
    ranks, it starts each with ``popen_for_call()``'s answer (asked once per call) instead of
    ``subprocess.Popen``. Once per launcher class.

    Raises:
        LightningPrivateMoved: The launcher or its method is not where Lightning had it, or
            no longer calls its module's ``subprocess.Popen``.
    """
    rank_zero = RANK_ZERO_MODULES.get(namespace)
    if rank_zero is not None and not _has_get_rank(_loaded(rank_zero)):
        raise LightningPrivateMoved(f"{rank_zero}._get_rank", "does not have")
    for name in LAUNCHER_MODULES.get(namespace, ()):
        module = _loaded(name)
        launcher = getattr(module, _LAUNCHER, None)
        original = getattr(launcher, _CALL, None)
        if launcher is None or original is None:
            raise LightningPrivateMoved(f"{name}.{_LAUNCHER}.{_CALL}", "does not have")
        if getattr(original, _ROUTED, False):
            continue
        names = getattr(getattr(original, "__code__", None), "co_names", ())
        if getattr(module, "subprocess", None) is not subprocess or "Popen" not in names:
            raise LightningPrivateMoved(
                f"{name}.{_LAUNCHER}.{_CALL}", "no longer starts ranks with subprocess.Popen"
            )
        setattr(launcher, _CALL, _routed(module, original, popen_for_call))


def _routed(
    module: ModuleType, original: Callable[[Any], None], popen_for_call: Callable[[], Popen]
) -> Callable[[Any], None]:
    @functools.wraps(original)
    def call_children_scripts(launcher: Any) -> None:
        with _popen_in(module, popen_for_call()):
            original(launcher)

    setattr(call_children_scripts, _ROUTED, True)
    return call_children_scripts


@contextmanager
def _popen_in(module: ModuleType, popen: Popen) -> Iterator[None]:
    """``module``'s global ``subprocess`` with ``popen`` as its ``Popen``, for the block: only
    the launcher's own call sees it (the real module stays untouched for every other caller)."""
    module.subprocess = _Subprocess(popen)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.subprocess = subprocess  # type: ignore[attr-defined]


class _Subprocess:
    """The ``subprocess`` module, but for its ``Popen``."""

    def __init__(self, popen: Popen) -> None:
        self.Popen = popen

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def fresh_lightning_state() -> None:
    """In a process forked from rank 0's while it started its ranks: Lightning's state as its
    import leaves it in a new interpreter with this environment (``rank_zero_only.rank``
    from LOCAL_RANK, not rank 0's; each launcher module's own ``subprocess``)."""
    for module in map(sys.modules.get, {n for ns in LAUNCHER_MODULES.values() for n in ns}):
        if module is not None and isinstance(getattr(module, "subprocess", None), _Subprocess):
            module.subprocess = subprocess  # type: ignore[attr-defined]
    for module in map(sys.modules.get, RANK_ZERO_MODULES.values()):
        if module is not None and _has_get_rank(module):  # checked when routed
            # the same object in every namespace (lightning_utilities'): set once is enough
            module.rank_zero_only.rank = module._get_rank() or 0
            return


def _has_get_rank(module: ModuleType) -> bool:
    return callable(getattr(module, "_get_rank", None)) and hasattr(module, "rank_zero_only")


def _loaded(name: str) -> ModuleType:
    try:  # loaded with its namespace: this only looks it up
        return importlib.import_module(name)
    except ImportError as exc:
        raise LightningPrivateMoved(name, f"does not have ({exc})") from None
