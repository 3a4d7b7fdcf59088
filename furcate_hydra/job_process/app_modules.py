"""Which modules are the app's own, and forgetting them in a process that will run the app
anew (a DDP rank forked from its job's process: ``fresh_interpreter``).

The app's modules are those loaded from outside the standard library and the installed packages
(site-packages): its script's siblings, its package in an editable checkout. furcate's own stay
(they run the rank), and so do extension modules (which cannot be loaded twice) and anything
with no file (built in, frozen, a namespace package, a module-like object such as torch.ops).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from types import ModuleType

from furcate_hydra.python_dirs import library_dirs

__all__ = ["forget_app_modules"]

# modules a rank keeps although they live outside the installed packages: what runs it
_KEPT_PACKAGES = ("furcate_hydra", "hydra_plugins")
_MAIN_NAMES = ("__main__", "__mp_main__")


def forget_app_modules() -> None:
    """Drop the app's own modules (those outside the standard library and the installed
    packages, furcate's and extension modules aside): the command imports them anew, with
    none of rank 0's state."""
    libraries = library_dirs(stdlib=True)
    extensions = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name, module in list(sys.modules.items()):
        if _is_apps(name, module, libraries, extensions):
            del sys.modules[name]


def _is_apps(
    name: str, module: ModuleType | None, libraries: tuple[str, ...], extensions: tuple[str, ...]
) -> bool:
    # the file from the module's dict: a lazy module (MLflow's) would load itself to answer
    file = getattr(module, "__dict__", {}).get("__file__")
    if not isinstance(file, str) or file.startswith(libraries) or not os.path.isabs(file):
        return False  # built in, frozen, a namespace package, a library's, or no file's
    if file.endswith(extensions) or name in _MAIN_NAMES:
        return False  # an extension module cannot be loaded twice; runpy makes __main__
    if name.partition(".")[0] in _KEPT_PACKAGES:
        return False
    return not os.path.realpath(file).startswith(libraries)
