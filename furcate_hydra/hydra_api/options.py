"""Plugin options, read once: the plugin's config dataclass is the one source of defaults.

Hydra hands a plugin its ``hydra.launcher`` / ``hydra.sweeper`` node with every field of the
plugin's dataclass set. ``with_defaults`` completes a partial mapping from the same dataclass (a
plugin built in Python, a test), so the parsers below read ``options[key]`` and never restate a
default, and refuses a key the dataclass lacks. ``OptionError`` is the one error a bad option
raises, in the sweepers as in the launcher.
"""

from __future__ import annotations

import dataclasses
import difflib
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


def with_defaults(conf_type: type, options: Mapping[str, Any], plugin: str) -> dict[str, Any]:
    """``options`` as plain values, with each field of ``conf_type`` they lack at its default.

    A field whose default is itself a config dataclass is completed the same way. A key the
    dataclass does not know is refused: Hydra's schema refuses one typed as
    ``hydra.launcher.<key>=...`` but suggests ``+hydra.launcher.<key>=...``, which it takes
    and which would otherwise be ignored without a word. Keys Hydra reads itself when it
    instantiates a plugin (``_target_``) are allowed.

    Args:
        conf_type: The plugin's config dataclass.
        options: The plugin's config node, or part of it.
        plugin: How users pick the plugin, e.g. ``hydra/launcher=furcate``; its group names
            the options in messages (``hydra.launcher.<key>``).

    Raises:
        OptionError: For a key that is no option, nested ones included, with the closest
            option as the fix.
    """
    group = plugin.partition("=")[0]
    return _complete(conf_type, options, group.replace("/", "."), plugin)


def _complete(conf_type: type, options: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """``with_defaults`` for the node at ``key``; ``where`` names that node in messages."""
    fields = [field.name for field in dataclasses.fields(conf_type)]
    complete: dict[str, Any] = {}
    for name, value in options.items():
        if str(name) not in fields and str(name) not in _HYDRA_KEYS:
            raise _unknown_option(key, str(name), value, fields, where)
        complete[str(name)] = value
    for field in dataclasses.fields(conf_type):
        default = _default(field)
        given = complete.get(field.name, dataclasses.MISSING)
        if dataclasses.is_dataclass(default):
            nested = plain(given) if given is not dataclasses.MISSING else {}
            if isinstance(nested, Mapping):
                nested_key = f"{key}.{field.name}"
                complete[field.name] = _complete(
                    type(default), nested, nested_key, f"{nested_key} ({where})"
                )
        elif given is dataclasses.MISSING:
            complete[field.name] = default
    return complete


# What Hydra's instantiate reads from a plugin's node; a dataclass need not declare them.
_HYDRA_KEYS = frozenset({"_target_", "_recursive_", "_convert_", "_partial_", "_args_"})


def _unknown_option(key: str, name: str, value: Any, fields: list[str], where: str) -> OptionError:
    # Hydra's own keys and the defaults list are fields, but no option a user sets.
    options = sorted(field for field in fields if not field.startswith("_") and field != "defaults")
    listed = ", ".join(options)
    close = difflib.get_close_matches(name, options, n=1)
    fix = (
        f"did you mean {key}.{close[0]}? (its options: {listed})"
        if close
        else f"set one of its options instead: {listed}"
    )
    return OptionError(f"{key}.{name}", value, f"not an option of {where}", fix)


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
