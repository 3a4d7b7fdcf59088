"""Whose a class is, read from its lineage: Lightning's (either namespace) or torchmetrics',
and which hooks an object's own classes define. The fusion layer never imports Lightning or
torchmetrics: it reads their objects by class name and module, as ``lightning._namespace``
does on the Lightning side."""

from __future__ import annotations

LIGHTNING = ("lightning", "pytorch_lightning")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in packages)


def derives_from(obj: object, class_name: str, packages: tuple[str, ...]) -> bool:
    """``obj``'s class is, or derives from, the class ``class_name`` of one of ``packages``."""
    return any(
        cls.__name__ == class_name and _within(cls.__module__, packages)
        for cls in type(obj).__mro__
    )


def is_lightning(cls: type) -> bool:
    """``cls`` is one of Lightning's own classes (either namespace)."""
    return _within(cls.__module__, LIGHTNING)


def defines(obj: object, hook: str) -> bool:
    """``obj``'s own classes define ``hook``: the first class that has it is not Lightning's
    (whose defaults do nothing, or warn)."""
    for cls in type(obj).__mro__:
        if hook in vars(cls):
            return not is_lightning(cls)
    return False
