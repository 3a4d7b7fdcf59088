"""What a module's steps read of its own values: its attributes and ``hparams`` entries, by
name, recorded while a probe step runs.

A fused group's steps run on one module; a value its members hold differently reaches each
member's step only where furcate sets it per member (``member_scalars``). So what the steps
read decides what must be equal within a group. Reads are recorded at the first level: an
attribute by its name (``loss_fn``: everything in that child module), an ``hparams`` entry
as ``hparams.<key>`` (everything under it), ``hparams.*`` for a step that reads them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ALL_HPARAMS = "hparams.*"


@contextmanager
def reads_recorded(module: Any) -> Iterator[set[str]]:
    """The names ``module``'s own code reads of it while the block runs (the set fills as it
    runs); the module's class and its ``hparams`` are its own again after."""
    reads: set[str] = set()
    own: Any = type(module)
    watched = {name for name in vars(module) if not name.startswith("_") and name != "training"}
    watched |= set(getattr(module, "_modules", {}))

    def __getattribute__(self: Any, name: str) -> Any:
        if name in watched:
            reads.add(name)
        return own.__getattribute__(self, name)

    recording = type(own.__name__, (own,), {"__getattribute__": __getattribute__})
    hparams = module.__dict__.get("_hparams")
    hparams_class = type(hparams)
    # object's own setattr: Lightning's AttributeDict would keep "__class__" as an entry
    object.__setattr__(module, "__class__", recording)
    if isinstance(hparams, dict):
        object.__setattr__(hparams, "__class__", _recording_dict(hparams_class, reads))
    try:
        yield reads
    finally:
        object.__setattr__(module, "__class__", own)
        if isinstance(hparams, dict):
            object.__setattr__(hparams, "__class__", hparams_class)


def _recording_dict(base: Any, reads: set[str]) -> type:
    """``base`` (a dict, Lightning's ``AttributeDict``) noting each entry read."""

    def getitem(self: Any, key: Any) -> Any:
        reads.add(f"hparams.{key}")
        return base.__getitem__(self, key)

    def get(self: Any, key: Any, default: Any = None) -> Any:
        reads.add(f"hparams.{key}")
        return base.get(self, key, default)

    def everything(name: str) -> Any:
        def read_all(self: Any, *args: Any) -> Any:
            reads.add(ALL_HPARAMS)
            return getattr(base, name)(self, *args)

        return read_all

    attributes: dict[str, Any] = {"__getitem__": getitem, "get": get}
    for name in ("__iter__", "items", "values", "keys", "copy", "__len__", "__repr__"):
        attributes[name] = everything(name)
    if "__getattr__" in vars(base) or any("__getattr__" in vars(c) for c in base.__mro__[1:-1]):
        attributes["__getattr__"] = lambda self, key: getitem(self, key)
    return type(base.__name__, (base,), attributes)


def is_read(path: str, reads: set[str]) -> bool:
    """Whether the value at ``path`` (``alpha``, ``loss_fn.label_smoothing``,
    ``hparams.model.lr``) is under something the steps read."""
    parts = path.split(".")
    if parts[0] == "hparams" and len(parts) > 1:
        return ALL_HPARAMS in reads or f"hparams.{parts[1]}" in reads
    return parts[0] in reads
