"""Lightning namespaces imported while this layer itself was loading, patched once it is whole.

``hydra.launcher.lightning=auto`` patches each Lightning namespace right after the job imports
it (``lightning_auto``). This layer imports Lightning too, and the patch needs the layer whole:
a task that imports ``furcate_hydra.lightning`` inside its function, before any Lightning,
reaches the patch mid-import. The namespace waits here; the package's last line patches it.
"""

from __future__ import annotations

__all__ = ["defer", "install_pending"]

_names: list[str] = []


def defer(name: str) -> None:
    """Patch ``name`` when this layer has loaded."""
    _names.append(name)


def install_pending() -> None:
    """Patch what waited (``furcate_hydra.lightning``'s last line)."""
    from furcate_hydra.lightning._own_trainer import install

    while _names:
        install(_names.pop(0))
