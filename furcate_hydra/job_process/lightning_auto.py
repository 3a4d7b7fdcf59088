"""``hydra.launcher.lightning: auto``: reach a Trainer the task builds itself, in its job.

    job's process, before the task: install_for_job(route_ranks)
      a namespace already imported (the fork server preloaded the app) ──► patched now
      one not imported yet ──► patched right after its first import (an import hook)
    patched: furcate_hydra.lightning._own_trainer (what a Trainer and MLflow logger get), and
      what install_for_job was given (warm_ranks.route_ranks: its DDP ranks forked warm)

Light on purpose: it imports neither torch nor Lightning, so the launcher's side may call it;
the Lightning layer is loaded only once the app's own Lightning is. Which namespace the app
uses is decided by what it imports and builds, not by what is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from furcate_hydra import env_vars
from furcate_hydra.known_warnings import ignore_lightning_srun_hint

__all__ = ["AUTO", "MODES", "OFF", "install_for_job", "server_imports"]

AUTO, OFF = "auto", "off"
MODES = (AUTO, OFF)
# the packages whose Trainer and MLFlowLogger a job patches (lightning.pytorch's own name
# first: its package `lightning` imports it on `import lightning as L`)
_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
_also: list[Callable[[str], None]] = []  # install_for_job's, in this job's process


def install_for_job(*also: Callable[[str], None]) -> None:
    """In a job whose ``FURCATE_LIGHTNING`` is ``auto``: patch each Lightning namespace the job
    imports, now or when it does; ``also`` are called with each such namespace's name too
    (the job's process routes its DDP ranks). Anything else leaves the job alone."""
    if os.environ.get(env_vars.LIGHTNING, OFF) != AUTO:
        return
    _also.extend(call for call in also if call not in _also)
    ignore_lightning_srun_hint()  # before the app builds its Trainer
    for name in _NAMESPACES:
        if name in sys.modules:
            _patch(name)
    if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


def server_imports(mode: object, preload: Sequence[str] | None = None) -> tuple[str, ...]:
    """What the fork server imports once for ``hydra.launcher.lightning=mode``, so that no job
    pays for it (~0.2 s a job here): the Lightning layer, where the app has loaded a Lightning
    namespace in the launcher's process (imported at its top) or ``preload`` names one;
    nothing otherwise (a task that never imports Lightning never loads it)."""
    packages = {name.split(".")[0] for name in _NAMESPACES}
    lightning = any(name in sys.modules for name in _NAMESPACES) or any(
        name.split(".")[0] in packages for name in preload or ()
    )
    layer = layer_for(mode)
    return (layer,) if layer is not None and lightning else ()


def layer_for(mode: object) -> str | None:
    """The module of furcate's Lightning layer that a job under ``mode`` loads once it imports
    Lightning, and that a fork server with Lightning should have; None where jobs never do."""
    return "furcate_hydra.lightning._own_trainer" if mode == AUTO else None


def _patch(name: str) -> None:
    for call in _also:  # before the layer's patch: they need only the namespace
        call(name)
    # here, not at the top: the job has imported Lightning by now, the launcher never does
    if _layer_loading():  # its own import of Lightning got here: patched at its end
        from furcate_hydra.lightning._pending import defer

        defer(name)
        return
    from furcate_hydra.lightning._own_trainer import install

    install(name)


def _layer_loading() -> bool:
    """Whether ``furcate_hydra.lightning`` is being imported now (Python marks the module's
    spec ``_initializing`` while it runs; where it does not, nothing waits)."""
    package = sys.modules.get("furcate_hydra.lightning")
    return bool(getattr(getattr(package, "__spec__", None), "_initializing", False))


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds a Lightning namespace with the other finders, and patches it once it ran."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAMESPACES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader, fullname)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _patch(self.name)

    def __getattr__(self, name: str) -> object:
        # the rest of the loader's interface (resource readers, ...) is the wrapped loader's
        return getattr(self.loader, name)
