"""furcate's ``exclude_configs``: drop configs of a grid that match any exclusion rule.

A rule is a mapping of dotted config keys to values; a config is excluded when every pair of
one rule matches it. A list value means "any of". A key naming a config group matches the
group's choice (``optimizer: sgd``); any other key matches the composed config's value there.
Imports no Hydra: callers hand in the composed config and the group choices as plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from furcate_hydra.errors import FurcateConfigError

__all__ = [
    "ABSENT",
    "ConfigLookup",
    "ConfigView",
    "ExclusionRule",
    "parse_exclusions",
    "same_value",
    "unknown_keys",
]

# What ConfigView.get returns for a key a config does not have.
ABSENT = object()


class ConfigLookup(Protocol):
    """What rules read a config through: a value (or ABSENT) per dotted key."""

    def get(self, key: str) -> Any: ...

    def has(self, key: str) -> bool: ...


@dataclass(frozen=True)
class ConfigView:
    """A composed config (plain containers) and its config-group choices (``model/encoder``)."""

    config: Mapping[str, Any]
    choices: Mapping[str, Any]

    def get(self, key: str) -> Any:
        """The group choice for ``key`` if it names a group, else the value at the dotted key."""
        group = key.replace(".", "/")
        if group in self.choices:
            return self.choices[group]
        node: Any = self.config
        for part in key.split("."):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif _is_list(node) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return ABSENT
        return node

    def has(self, key: str) -> bool:
        return self.get(key) is not ABSENT


@dataclass(frozen=True)
class ExclusionRule:
    """All of ``conditions`` (key, allowed values) must hold for a config to be excluded."""

    conditions: tuple[tuple[str, tuple[Any, ...]], ...]

    def matches(self, view: ConfigLookup) -> bool:
        return all(
            any(same_value(view.get(key), allowed) for allowed in values)
            for key, values in self.conditions
        )

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.conditions)

    def __str__(self) -> str:
        parts = (
            f"{key}={values[0]!r}" if len(values) == 1 else f"{key} in {list(values)!r}"
            for key, values in self.conditions
        )
        return "{" + ", ".join(parts) + "}"


def parse_exclusions(raw: Any, key: str = "hydra.sweeper.exclude") -> list[ExclusionRule]:
    """Rules from the config's list of mappings; nested mappings become dotted keys."""
    if raw is None:
        return []
    example = f"set {key}=[{{optimizer: SGD, learning_rate: 0.001}}]"
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise FurcateConfigError(key, raw, "must be a list of mappings (key: value)", example)
    rules = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not entry:
            raise FurcateConfigError(
                f"{key}[{index}]",
                entry,
                "must be a non-empty mapping of config keys to the values that exclude a config",
                example,
            )
        conditions = []
        for dotted, value in _flatten(entry, ""):
            if isinstance(value, list | tuple):
                if not value:
                    raise FurcateConfigError(
                        f"{key}[{index}].{dotted}", value, "an empty list matches nothing", example
                    )
                conditions.append((dotted, tuple(value)))
            else:
                conditions.append((dotted, (value,)))
        rules.append(ExclusionRule(tuple(conditions)))
    return rules


def unknown_keys(rules: Iterable[ExclusionRule], views: Iterable[ConfigLookup]) -> list[str]:
    """Keys of ``rules`` found in none of ``views``: most likely typos, so callers refuse them."""
    views = list(views)
    keys = dict.fromkeys(k for rule in rules for k in rule.keys)
    return [k for k in keys if not any(view.has(k) for view in views)]


def _is_list(node: Any) -> bool:
    return isinstance(node, Sequence) and not isinstance(node, str | bytes)


def _flatten(entry: Mapping[Any, Any], prefix: str) -> Iterable[tuple[str, Any]]:
    for name, value in entry.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{dotted}.")
        else:
            yield dotted, value


def same_value(actual: Any, wanted: Any) -> bool:
    """Whether a config's value ``actual`` is the rule's value ``wanted``: numbers match
    however they are written, booleans only booleans."""
    if actual is ABSENT:
        return False
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return isinstance(actual, bool) and isinstance(wanted, bool) and actual == wanted
    if actual == wanted:
        return True
    # `learning_rate: 1e-3` in YAML and 0.001 from the command line are the same choice.
    if isinstance(actual, int | float | str) and isinstance(wanted, int | float | str):
        try:
            return float(actual) == float(wanted)
        except ValueError:
            return False
    return False
