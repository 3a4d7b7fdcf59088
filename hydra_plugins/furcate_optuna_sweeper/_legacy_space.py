"""``hydra.sweeper.search_space``: hydra-optuna-sweeper's deprecated form of the search space.

    search_space:
      x: {type: float, low: -5.5, high: 5.5, step: 0.5}  params: range(-5.5, 5.5, step=0.5)
      lr: {type: float, low: 1e-5, high: 1, log: true}   params: tag(log, interval(1e-05, 1.0))
      n: {type: int, low: 1, high: 8}                    params: int(interval(1, 8))
      opt: {type: categorical, choices: [Adam, SGD]}     params: choice(Adam, SGD)

Read as hydra-optuna-sweeper 1.2 reads it, with the warning it gives (a ``UserWarning``, so the
same ``-W`` filters apply; ``HYDRA_DEPRECATION_WARNINGS_AS_ERRORS`` makes it an error there and
here). As there: an int's step is 1 unless given; a step that does not divide ``high - low``
ends the space at the last step (Optuna's adjustment); ``log`` wins over ``step``, which is then
ignored (here with a warning); a key of another type (``low`` of a categorical) is ignored.
Where it would fail with a Python error (an unknown key or type, ``low`` above ``high``, no
``choices``), this raises an OptionError that says how to write the entry. Beside
``hydra.sweeper.params``, as there, it is ignored (unread) with a warning: the space is params.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from furcate_hydra.hydra_api.options import OptionError, plain
from hydra_plugins.furcate_optuna_sweeper._space import override_line, stepped_distribution

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["distributions_from_search_space"]

KEY = "hydra.sweeper.search_space"
_TYPES = ("int", "float", "categorical")
_FIELDS = ("type", "low", "high", "step", "log", "choices")
_EXAMPLE = (
    "{type: float, low: 0.0, high: 1.0}, {type: int, low: 1, high: 8, step: 1} or "
    "{type: categorical, choices: [a, b]}"
)


def distributions_from_search_space(search_space: Any, params: Any) -> dict[str, BaseDistribution]:
    """The entries of ``search_space`` as Optuna distributions, after the deprecation warning;
    ``{}`` where it is unset, or ignored beside ``params`` (``hydra.sweeper.params``)."""
    search_space = plain(search_space)
    if search_space is None:
        return {}
    if plain(params):
        ignored = _as_params(search_space) if isinstance(search_space, Mapping) else search_space
        warnings.warn(
            f"Both hydra.sweeper.params and {KEY} are configured: the search space is "
            f"hydra.sweeper.params, and {KEY} ({ignored}) is ignored, as hydra-optuna-sweeper "
            f"ignores it. Delete {KEY}, or move what it should add into hydra.sweeper.params",
            UserWarning,
            stacklevel=2,
        )
        return {}
    if not isinstance(search_space, Mapping):
        raise OptionError(
            KEY,
            search_space,
            "must map each param to {type, low, high, step, log, choices}",
            f"write it as hydra.sweeper.params (e.g. x: interval(0, 1)), or as {{x: {_EXAMPLE}}}",
        )
    distributions = {
        str(name): _distribution(str(name), entry) for name, entry in search_space.items()
    }
    message = (
        f"`{KEY}` is deprecated and will be removed in the next major release. Please configure "
        f"with `hydra.sweeper.params`: {_as_params(search_space)}"
    )
    if os.environ.get("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS"):
        raise OptionError(
            KEY,
            search_space,
            "is deprecated (HYDRA_DEPRECATION_WARNINGS_AS_ERRORS is set)",
            f"write it as hydra.sweeper.params: {_as_params(search_space)}",
        )
    warnings.warn(message, UserWarning, stacklevel=2)
    return distributions


def _distribution(name: str, entry: Any) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    key = f"{KEY}.{name}"
    if not isinstance(entry, Mapping) or entry.get("type") not in _TYPES:
        raise OptionError(
            key, entry, f"needs a type, one of {', '.join(_TYPES)}", f"write e.g. {_EXAMPLE}"
        )
    if unknown := sorted(str(k) for k in entry if k not in _FIELDS):
        raise OptionError(
            key,
            entry,
            f"has keys hydra-optuna-sweeper does not know: {', '.join(unknown)}",
            f"use only {', '.join(_FIELDS)}",
        )
    kind = entry["type"]
    if kind == "categorical":
        choices = entry.get("choices")
        if (
            not isinstance(choices, list)
            or not choices
            or not all(c is None or isinstance(c, str | int | float | bool) for c in choices)
        ):
            raise OptionError(
                key,
                entry,
                "needs choices: a non-empty list of numbers, strings, booleans or null",
                "write {type: categorical, choices: [a, b]}",
            )
        return CategoricalDistribution(choices)
    integer = kind == "int"
    low, high = (_bound(key, entry, end, integer) for end in ("low", "high"))
    log = entry.get("log", False)
    step = entry.get("step")
    if not isinstance(log, bool):
        raise OptionError(key, entry, "has a log that is not true or false", "set log: true")
    if low > high or (log and low <= 0):
        problem = "needs low at most high" if low > high else "is log-scaled: low must be above 0"
        raise OptionError(key, entry, problem, f"write e.g. {{type: {kind}, low: 1, high: 100}}")
    if step is not None and (
        isinstance(step, bool)
        or not isinstance(step, int | float)
        or step <= 0
        or (integer and step != int(step))
    ):
        raise OptionError(
            key,
            entry,
            f"has a step that is not a {'whole ' if integer else ''}number above 0",
            f"write e.g. step: {1 if integer else 0.5}, or leave step out",
        )
    if log:
        if step is not None:
            warnings.warn(
                f"{key}: log is set, so step {step} is ignored, as hydra-optuna-sweeper ignores it",
                UserWarning,
                stacklevel=3,
            )
        return (IntDistribution if integer else FloatDistribution)(low, high, log=True)
    if step is None and not integer:
        return FloatDistribution(low, high)
    return stepped_distribution(key, entry, low, high, step or 1, integer=integer)


def _bound(key: str, entry: Mapping[str, Any], end: str, integer: bool) -> Any:
    value = entry.get(end)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and value != int(value))
    ):
        raise OptionError(
            key,
            entry,
            f"needs {end}: a {'whole ' if integer else ''}number",
            f"write e.g. {{type: {entry['type']}, low: 1, high: 10}}",
        )
    return int(value) if integer else float(value)


def _as_params(search_space: Mapping[str, Any]) -> str:
    """The same space in hydra.sweeper.params syntax, as far as the entries can be read."""
    lines = []
    for name, entry in search_space.items():
        try:
            lines.append(f"{name}: {_param_text(entry)}")
        except (KeyError, TypeError, ValueError, AttributeError):
            lines.append(f"{name}: ...")
    return "; ".join(lines)


def _param_text(entry: Mapping[str, Any]) -> str:
    if entry["type"] == "categorical":
        if None in entry["choices"]:
            raise ValueError("Hydra's choice() cannot hold null")
        values = [override_line("v", c).partition("=")[2] for c in entry["choices"]]
        return f"choice({', '.join(values)})"
    cast = int if entry["type"] == "int" else float
    low, high = cast(entry["low"]), cast(entry["high"])
    step = entry.get("step")
    if entry.get("log"):
        inner = f"interval({low!r}, {high!r})"
        return f"tag(log, {'int(' + inner + ')' if cast is int else inner})"
    if step is not None:
        return f"range({low!r}, {high!r}, step={cast(step)!r})"
    return f"int(interval({low}, {high}))" if cast is int else f"interval({low!r}, {high!r})"
