"""The launcher's side of a fork server that learns what its jobs import.

Each job's report names the installed packages it imported itself (``ChildReport.imported``);
those the server was never asked for go to it (``Preload``), once. Its answer (``Preloaded``)
is said in one line, and what it imported is remembered for the app's next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from furcate_hydra.execution.forkserver.protocol import Preloaded

__all__ = ["ServerImports"]

log = logging.getLogger(__name__)

# Lightning's namespaces: where the server learns one, furcate's Lightning layer goes with it
_LIGHTNING = ("lightning", "pytorch_lightning")


class ServerImports:
    """What the server was asked to import, and what it did."""

    def __init__(self, learn: bool, lightning_layer: str | None) -> None:
        """``learn``: ask for what jobs report (``preload`` unset); ``lightning_layer``: the
        module the jobs load with a Lightning namespace (``PoolOptions.lightning_layer``)."""
        self._learn = learn
        self._layer = lightning_layer
        self._asked: set[str] = set()
        self._remembered: set[str] = set()  # asked as the app's earlier sweeps learned them
        self.learned: list[str] = []  # imported by the server on request, in its order

    def seen(self, imported: Sequence[str]) -> list[str]:
        """What to ask the server for, now that a job reports it imported ``imported``."""
        return self._ask(imported) if self._learn else []

    def remembered(self, modules: Sequence[str]) -> list[str]:
        """What to ask the server for, of what the app's earlier sweeps learned (the launch
        said so already)."""
        asked = self._ask(modules)
        self._remembered.update(asked)
        return asked

    def _ask(self, modules: Sequence[str]) -> list[str]:
        """Of ``modules``, those (with the Lightning layer) never asked for before."""
        new = [name for name in dict.fromkeys(modules) if name not in self._asked]
        layer = self._layer
        if layer is not None and layer not in self._asked and set(new) & set(_LIGHTNING):
            new.append(layer)
        self._asked.update(new)
        return new

    def imported(self, done: Preloaded) -> None:
        """The server's answer: said in one line; what it refused, each in one."""
        self.learned += [name for name in done.imported if name != self._layer]
        names = [name for name in done.imported if name not in (self._layer, *self._remembered)]
        if names:
            log.info(
                "furcate: the fork server imported %s (%.1f s), which the jobs imported "
                "themselves: the jobs after them start with it, and so does this app's next "
                "sweep (hydra.launcher.preload sets the list; preload=[] learns nothing)",
                ", ".join(names),
                done.seconds,
            )
        for name, why in done.refused.items():
            log.warning("furcate: the fork server does not import %s: %s", name, why)
