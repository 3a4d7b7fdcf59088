"""The sweep's grid: ``hydra.sweeper.params`` and the command line's sweeps, as Hydra reads them.

Grid order is Hydra's basic sweeper's: one axis per key in the order keys first appear
(``params`` before the command line, which wins for a key set in both), values in the order
written, the product taken with the last axis varying fastest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from furcate_hydra.errors import FurcateConfigError, first_line
from furcate_hydra.hydra_api.options import OptionError, as_option_error, plain
from furcate_hydra.sweeping.exclusion import ExclusionRule, parse_exclusions

__all__ = ["COMPOSE_ERRORS", "SweepSpec", "expand_grid", "parse_sweep_overrides"]

# What Hydra raises for config files it cannot compose (bad YAML, a missing group option, a
# value of the wrong type): an edit mid-sweep can cause any of them.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)


@dataclass(frozen=True)
class SweepSpec:
    """What decides the grid: the params lines and the exclusion rules."""

    params: tuple[tuple[str, str], ...]
    rules: tuple[ExclusionRule, ...]

    @classmethod
    def parse(cls, params: Any, exclude: Any) -> SweepSpec:
        params = plain(params)
        if params is None:
            params = {}
        if not isinstance(params, Mapping):
            raise OptionError(
                "hydra.sweeper.params",
                params,
                "must be a mapping of config keys to sweeps",
                "write it as `params: {learning_rate: 1e-3,1e-2, optimizer: choice(Adam,SGD)}`",
            )
        try:
            rules = parse_exclusions(plain(exclude), "hydra.sweeper.exclude")
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        lines = tuple((str(key), _param_value(key, value)) for key, value in params.items())
        return cls(lines, tuple(rules))


def parse_sweep_overrides(
    params: Iterable[tuple[str, str]],
    arguments: Sequence[str],
    parser: OverridesParser,
    problem: str,
    fix: str,
) -> list[tuple[str, Override]]:
    """(where it was set, override) pairs: ``params`` first, then the command line. Callers
    check each and let the later win for a key set in both (in the key's first position)."""
    parsed: list[tuple[str, Override]] = []
    for key, value in params:
        try:
            (override,) = parser.parse_overrides([f"{key}={value}"])
        except HydraException as exc:
            raise OptionError(
                f"hydra.sweeper.params.{key}", value, f"{problem} ({first_line(exc)})", fix
            ) from None
        parsed.append((f"hydra.sweeper.params.{key}", override))
    for override in parser.parse_overrides(list(arguments)):
        parsed.append((override.get_key_element(), override))
    return parsed


def expand_grid(
    spec: SweepSpec, arguments: Sequence[str], parser: OverridesParser
) -> list[list[str]]:
    """Every job's overrides, in grid order."""
    parsed = parse_sweep_overrides(
        spec.params,
        arguments,
        parser,
        "is not a valid Hydra override value",
        "use Hydra's sweep syntax: 1,2,3 or choice(a,b) or range(1,10) or glob(*)",
    )
    axes: dict[str, list[str]] = {}
    for source, override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise OptionError(
                    source,
                    (override.input_line or "").partition("=")[2],
                    "is an interval, which has no list of values to make a grid of",
                    "list the values (a,b,c, choice(...) or range(...)), or sample the "
                    "interval with hydra/sweeper=furcate_optuna",
                )
            axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            axes[key] = [f"{key}={override.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*axes.values())]


def _param_value(key: object, value: Any) -> str:
    if isinstance(value, list | tuple):  # `lr: [0.1, 0.01]` in YAML reads as a sweep too
        return ",".join(str(v) for v in value)
    if value is None or isinstance(value, Mapping):
        raise OptionError(
            f"hydra.sweeper.params.{key}",
            value,
            "must be a sweep written as Hydra overrides it",
            f"write it as `{key}: 1,2,3` (or choice(...), range(...), glob(...))",
        )
    return str(value)
