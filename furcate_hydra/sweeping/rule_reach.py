"""Exclusion rules that can exclude nothing: found before anything runs, not after a sweep.

A rule whose value is a typo (``{lr: 0.0l}``) matches no config and is otherwise accepted in
silence. Each key a rule names has a domain, what the sweep's configs can hold there:
``Values`` (the values a grid's composed configs have, or an Optuna choice's options) or
``NumberRange`` (an Optuna int or float distribution). A rule reaches no config when

- a key's values are all of a type the domain can never equal (``'abc'`` for a number):
  ``WRONG_TYPE``, which callers refuse, since no edit of the grid's values can make it match;
- a key's values are of the right type but none is in the domain: ``NO_VALUE``, a warning;
- each key's values occur, but never in one config together: ``NOT_TOGETHER`` (judged only
  where every config is known: a grid), a warning;
- a key's values lie in a continuous interval, where one exact value is sampled with
  probability 0: ``ALMOST_NEVER``, a warning.

Values compare as rules compare them (``same_value``): ``1e-3`` is ``0.001`` and ``'3'`` is
``3``, so a number and a string of digits can match; a boolean only matches a boolean.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from furcate_hydra.sweeping.exclusion import ConfigLookup, ExclusionRule, same_value

__all__ = [
    "Domain",
    "NumberRange",
    "Reach",
    "UnmatchedRule",
    "Values",
    "could_equal",
    "unmatched_rules",
]

# Values listed in a message before "… (N in all)".
_SHOWN = 10


class Domain(Protocol):
    """What the sweep's configs can hold at one key."""

    def holds(self, wanted: Any) -> bool:
        """Some config's value there is ``wanted``."""

    def could_hold(self, wanted: Any) -> bool:
        """``wanted`` is of a type that some config's value there could equal."""

    def kinds(self) -> str:
        """The types of the values there, as a message names them: ``a number``."""

    def describe(self) -> str:
        """What the values are, as a message says it: ``one of 0, 0.01``."""


@dataclass(frozen=True)
class Values:
    """A finite domain: the distinct values, in the order first seen."""

    values: tuple[Any, ...]

    @classmethod
    def distinct(cls, values: Iterable[Any]) -> Values:
        seen: dict[str, Any] = {}  # by repr: config values may be lists or mappings
        for value in values:
            seen.setdefault(repr(value), value)
        return cls(tuple(seen.values()))

    def holds(self, wanted: Any) -> bool:
        return any(same_value(value, wanted) for value in self.values)

    def could_hold(self, wanted: Any) -> bool:
        return any(could_equal(value, wanted) for value in self.values)

    def kinds(self) -> str:
        return " or ".join(dict.fromkeys(_kind(value) for value in self.values))

    def describe(self) -> str:
        return f"one of {self}" if len(self.values) > 1 else str(self)

    def __str__(self) -> str:
        shown = ", ".join(repr(value) for value in self.values[:_SHOWN])
        more = len(self.values) - _SHOWN
        return f"{shown}, … ({len(self.values)} in all)" if more > 0 else shown


@dataclass(frozen=True)
class NumberRange:
    """Numbers from ``low`` to ``high`` (both included), in steps of ``step`` from ``low``;
    without a step and not ``integer``, every float between them (a continuous interval)."""

    low: float
    high: float
    step: float | None = None
    integer: bool = False
    log: bool = False

    @property
    def continuous(self) -> bool:
        return not self.integer and self.step is None

    def holds(self, wanted: Any) -> bool:
        number = _number(wanted)
        if number is None or not Decimal(str(self.low)) <= number <= Decimal(str(self.high)):
            return False
        step = self.step if self.step is not None else (1 if self.integer else None)
        if step is None:
            return True
        return (number - Decimal(str(self.low))) % Decimal(str(step)) == 0

    def could_hold(self, wanted: Any) -> bool:
        return _number(wanted) is not None

    def kinds(self) -> str:
        return "an integer" if self.integer else "a number"

    def describe(self) -> str:
        return f"{self.kinds()} {self}"

    def __str__(self) -> str:
        low, high = _shown(self.low, self.integer), _shown(self.high, self.integer)
        if self.continuous:
            text = f"sampled from the interval [{low}, {high}]"
        else:
            step = self.step if self.step is not None else 1
            text = f"from {low} to {high}"
            if step != 1 or not self.integer:
                text += f" in steps of {_shown(step, self.integer)}"
        return text + (", log-scaled" if self.log else "")


class Reach(enum.Enum):
    """Why a rule excludes nothing; ``WRONG_TYPE`` is an error, the others warnings."""

    WRONG_TYPE = "wrong type"
    NO_VALUE = "no such value"
    NOT_TOGETHER = "never together"
    ALMOST_NEVER = "almost never sampled"


@dataclass(frozen=True)
class UnmatchedRule:
    """``rules[index]`` excludes nothing, for ``reach``; ``key`` is the key that shows it
    (None for ``NOT_TOGETHER``, where it takes them all)."""

    index: int
    rule: ExclusionRule
    reach: Reach
    key: str | None
    domains: Mapping[str, Domain] = field(repr=False)

    @property
    def wanted(self) -> tuple[Any, ...]:
        """The rule's values for ``key``."""
        return next((values for key, values in self.rule.conditions if key == self.key), ())

    def why(self, where: str) -> str:
        """Why it excludes nothing; ``where`` names the configs: ``of the grid``."""
        if self.reach is Reach.NOT_TOGETHER:
            keys = "; ".join(f"{k}: {self.domains[k]}" for k in self.rule.keys)
            return f"each of its values occurs, but no config {where} has them together ({keys})"
        assert self.key is not None
        domain = self.domains[self.key]
        if self.reach is Reach.ALMOST_NEVER:
            return (
                f"{self.key} is {domain.describe()}, where one exact value is sampled with "
                "probability 0; exclude on a choice(...) or range(...) key instead"
            )
        if self.reach is Reach.NO_VALUE:
            return f"{self.key} is {domain.describe()} in the configs {where}"
        shown = " or ".join(f"{value!r} ({_kind(value)})" for value in self.wanted)
        return (
            f"{self.key} is {domain.kinds()} in every config {where} ({domain}), "
            f"which {shown} can never equal"
        )

    def shown_value(self) -> Any:
        """The rule's value for ``key`` as written: one value, or the list."""
        wanted = self.wanted
        return wanted[0] if len(wanted) == 1 else list(wanted)


def unmatched_rules(
    rules: Sequence[ExclusionRule],
    domains: Mapping[str, Domain],
    configs: Sequence[ConfigLookup] | None = None,
    matched: Iterable[ExclusionRule] = (),
) -> list[UnmatchedRule]:
    """The rules that exclude nothing, in rule order.

    Args:
        rules: The exclusion rules.
        domains: Per key, what configs can hold there; keys without one are not judged.
        configs: Every config of the sweep, when all are known (a grid): then a rule whose
            values each occur but never together is found too.
        matched: Rules already seen matching a config (no need to look again).
    """
    known = set(matched)
    found = []
    for index, rule in enumerate(rules):
        if rule in known:
            continue
        reach, key = _judge(rule, domains)
        if reach is None and configs is not None and not any(rule.matches(c) for c in configs):
            reach = Reach.NOT_TOGETHER
        if reach is not None:
            found.append(UnmatchedRule(index, rule, reach, key, domains))
    return found


def _judge(rule: ExclusionRule, domains: Mapping[str, Domain]) -> tuple[Reach | None, str | None]:
    """The worst of the rule's keys: a wrong type, then a missing value, then a value that
    a continuous interval almost never gives."""
    verdicts: list[tuple[Reach, str]] = []
    for key, values in rule.conditions:
        domain = domains.get(key)
        if domain is None:
            continue
        if not any(domain.holds(value) for value in values):
            wrong = not any(domain.could_hold(value) for value in values)
            verdicts.append((Reach.WRONG_TYPE if wrong else Reach.NO_VALUE, key))
        elif isinstance(domain, NumberRange) and domain.continuous:
            verdicts.append((Reach.ALMOST_NEVER, key))
    order = list(Reach)
    if not verdicts:
        return None, None
    return min(verdicts, key=lambda verdict: order.index(verdict[0]))


def could_equal(actual: Any, wanted: Any) -> bool:
    """Whether some value of ``actual``'s type could be ``wanted``, as ``same_value`` compares:
    a string of digits can be a number, and any number can be some string's value."""
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return isinstance(actual, bool) and isinstance(wanted, bool)
    if actual is None or wanted is None:
        return actual is None and wanted is None
    if isinstance(actual, int | float):
        return isinstance(wanted, int | float) or _number(wanted) is not None
    if isinstance(actual, str):
        return isinstance(wanted, str | int | float)
    if isinstance(actual, Mapping):
        return isinstance(wanted, Mapping)
    if isinstance(actual, list | tuple):
        return isinstance(wanted, list | tuple)
    return type(actual) is type(wanted)


def _number(value: Any) -> Decimal | None:
    """``value`` as a number, as ``same_value`` reads it; None for what no number equals."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(str(float(value)) if isinstance(value, str) else str(value))
    except (ValueError, InvalidOperation):
        return None
    return number if number.is_finite() else None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _shown(value: float, integer: bool) -> str:
    return str(int(value)) if integer else repr(float(value))
