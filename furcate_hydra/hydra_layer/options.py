"""Plugin options, read once: the plugin's config dataclass is the one source of defaults.

Hydra hands a plugin its ``hydra.launcher`` / ``hydra.sweeper`` node with every field of the
plugin's dataclass set. ``with_defaults`` completes a partial mapping from the same dataclass (a
plugin built in Python, a test), so the parsers below read ``options[key]`` and never restate a
default. ``OptionError`` is the one error a bad option raises, in the sweepers as in the launcher.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from furcate_hydra.errors import FurcateConfigError

__all__ = ["OptionError", "as_option_error", "plain", "with_defaults"]


class OptionError(FurcateConfigError, CompactHydraException):
    """A bad ``hydra.launcher`` or ``hydra.sweeper`` option: Hydra prints just the message
    (key, value, problem, fix), not a stack trace."""


def as_option_error(error: FurcateConfigError) -> OptionError:
    """The same complaint, as the error Hydra prints without a stack trace."""
    if isinstance(error, OptionError):
        return error
    return OptionError(error.key, error.value, error.problem, error.fix)


def with_defaults(conf_type: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as plain values, with each field of ``conf_type`` they lack at its default.

    A field whose default is itself a config dataclass is completed the same way. Keys the
    dataclass does not know are kept: Hydra adds ``_target_``, and unknown keys were refused
    by Hydra's structured config before a plugin sees them.
    """
    complete = {str(key): value for key, value in options.items()}
    for field in dataclasses.fields(conf_type):
        default = _default(field)
        given = complete.get(field.name, dataclasses.MISSING)
        if dataclasses.is_dataclass(default):
            nested = plain(given) if given is not dataclasses.MISSING else {}
            if isinstance(nested, Mapping):
                complete[field.name] = with_defaults(type(default), nested)
        elif given is dataclasses.MISSING:
            complete[field.name] = default
    return complete


def plain(value: Any) -> Any:
    """OmegaConf nodes as plain Python values (resolved); anything else as it is."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise TypeError(f"config field {field.name!r} has no default")
