"""Lightning's two namespaces, and which one an app's objects belong to.

Lightning 2.x ships the same code twice: ``lightning.pytorch`` (package ``lightning``, what
Lightning's docs and most templates import as ``import lightning as L``) and
``pytorch_lightning``. Their classes are distinct: a Trainer of one refuses a LightningModule
of the other. furcate decides a job's namespace from the app's own objects (the classes of its
module, datamodule and Trainer), never from what happens to be installed, and builds the
Trainer, logger and error messages of that namespace. furcate's own callbacks are Callbacks
of every installed namespace (``CallbackBase``), so one instance fits either Trainer.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from furcate_hydra.errors import FurcateConfigError

__all__ = [
    "LIGHTNING",
    "NAMESPACES",
    "PYTORCH_LIGHTNING",
    "CallbackBase",
    "CheckpointBase",
    "Namespace",
    "namespace_of",
    "namespaces_of",
    "trainer_namespace",
]

LIGHTNING = "lightning.pytorch"
PYTORCH_LIGHTNING = "pytorch_lightning"
NAMESPACES = (LIGHTNING, PYTORCH_LIGHTNING)
# how an app spells each import, for the message that says which one to change
_IMPORTS = {LIGHTNING: "import lightning as L", PYTORCH_LIGHTNING: "import pytorch_lightning as pl"}


@dataclass(frozen=True)
class Namespace:
    """One of Lightning's namespaces; its classes are looked up when asked for."""

    name: str

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(self.name)

    @property
    def trainer_class(self) -> Any:
        return self.module.Trainer

    @property
    def mlflow_logger_class(self) -> Any:
        return importlib.import_module(f"{self.name}.loggers").MLFlowLogger

    @property
    def sigterm_exception(self) -> type[BaseException]:
        exceptions = importlib.import_module(f"{self.name}.utilities.exceptions")
        return exceptions.SIGTERMException  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return self.name


def installed_namespaces() -> tuple[Namespace, ...]:
    """The namespaces this environment can import (``pytorch_lightning`` always, with furcate)."""
    return tuple(
        Namespace(name) for name in NAMESPACES if importlib.util.find_spec(name.split(".")[0])
    )


def namespaces_of(obj: object) -> frozenset[str]:
    """The namespaces whose Lightning classes ``obj``'s class derives from (empty: none;
    both: one of furcate's callbacks, which fit either)."""
    found: set[str] = set()
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        for name in NAMESPACES:
            if klass.__module__ == name or klass.__module__.startswith(name + "."):
                found.add(name)
    return frozenset(found)


def namespace_of(obj: object) -> Namespace | None:
    """The one namespace of ``obj`` (a module, datamodule or Trainer), or None for an object
    of no namespace or of both."""
    found = namespaces_of(obj)
    return Namespace(next(iter(found))) if len(found) == 1 else None


def trainer_namespace(trainer: object, parts: Iterable[tuple[str, object]]) -> Namespace:
    """The Trainer's namespace, once every named part (``("model", module)``, ...) is checked
    to belong to it too; objects of no Lightning class (a plain DataLoader) are let through.

    Raises:
        FurcateConfigError: A part belongs to the other namespace: the message names the part,
            its class and file, and the import to change.
    """
    namespace = namespace_of(trainer)
    if namespace is None:
        raise TypeError(f"{type(trainer).__qualname__} is not a Lightning Trainer")
    for role, part in parts:
        found = namespaces_of(part)
        if found and namespace.name not in found:
            raise mixed_namespaces(namespace, role, part)
    return namespace


def mixed_namespaces(trainer: Namespace, role: str, part: object) -> FurcateConfigError:
    """The error for ``part`` (the Trainer's ``role``) of the other namespace than ``trainer``."""
    other = PYTORCH_LIGHTNING if trainer.name == LIGHTNING else LIGHTNING
    cls = type(part)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__module__ == other or cls.__module__.startswith(other + "."):
        # one of Lightning's own classes: its twin in the Trainer's namespace
        twin = f"{trainer.name}{cls.__module__[len(other) :]}.{cls.__qualname__}"
        fix = f"use {twin} instead of {name} (in the code or the config's _target_ that makes it)"
    else:
        fix = (
            f"use one namespace: in {_source_of(cls)}, replace `{_IMPORTS[other]}` (or "
            f"`from {other} import ...`) with `{_IMPORTS[trainer.name]}` (or `from "
            f"{trainer.name} import ...`), or build the Trainer from `{other}`"
        )
    return FurcateConfigError(
        role,
        name,
        f"it is a `{other}` class, but the Trainer is a `{trainer.name}` Trainer; Lightning's "
        "two namespaces hold distinct classes and one Trainer takes only its own",
        fix,
    )


def _source_of(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        path = None
    return path or f"module {cls.__module__}"


def _dual_base(kind: str) -> Any:
    """A class deriving from ``kind`` (``Callback``, ``Checkpoint``) of every installed
    namespace: Lightning's isinstance checks (callbacks, checkpoint callbacks) then pass in
    either Trainer. The hooks are the same code in both, so the order of bases is moot."""
    module = "callbacks"
    bases = tuple(
        getattr(importlib.import_module(f"{ns.name}.{module}"), kind)
        for ns in installed_namespaces()
    )
    return bases[0] if len(bases) == 1 else type(kind, bases, {"__module__": __name__})


if TYPE_CHECKING:
    # at run time a Callback (Checkpoint) of each installed namespace; typed as one of them
    from pytorch_lightning.callbacks import Callback as CallbackBase
    from pytorch_lightning.callbacks import Checkpoint as CheckpointBase
else:
    CallbackBase = _dual_base("Callback")
    CheckpointBase = _dual_base("Checkpoint")
