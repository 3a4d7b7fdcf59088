"""What the sweep checks before its first trial, on configs composed up front.

search space ──► one config per choice of each categorical param (probes, at most 64)
             ──► job dir outside the sweep dir, a rule key in no config (a typo): refused
             ──► rules judged on the params' distributions: wrong type refused, no match warned
grid sampler ──► every config of the grid known: rules judged on them all, as the grid sweeper
                 does; n_trials at most the configs left
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Mapping
from typing import Any

import optuna

from furcate_hydra.sweepers.exclusion_filter import (
    GridFilter,
    refuse_wrong_types,
    unmatched_warning,
)
from furcate_hydra.sweeping.rule_reach import Domain, unmatched_rules
from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
from hydra_plugins.furcate_optuna_sweeper._space import SearchSpace, grid_values, space_domains

__all__ = ["check_before_trials", "study_sampler"]

log = logging.getLogger(__name__)

# Configs composed up front to check job dirs and exclusion keys: one per choice of each
# categorical param.
_MAX_PROBES = 64
# How messages name the configs exclusion rules are judged on, without a grid to list them.
_SAMPLED = "the search space can sample"


def check_before_trials(
    options: OptunaOptions, space: SearchSpace, grid_filter: GridFilter
) -> None:
    """Before the first trial: refuse a job dir outside the sweep dir and a rule key in no
    config (a typo), on one config per choice of each categorical param (a group choice
    decides which keys exist); then, unless a grid sampler lists every config, judge the
    rules against the search space (``_judge_rules``)."""
    rules = options.rules
    probes, complete = _probe_configs(space)
    seen = grid_filter.probe(probes if rules else probes[:1], rules)
    if rules and not isinstance(options.sampler, functools.partial):
        _judge_rules(options, space, seen if complete else {})


def study_sampler(
    options: OptunaOptions, space: SearchSpace, grid_filter: GridFilter
) -> tuple[Any, int]:
    """The study's sampler and how many trials it runs: a grid sampler gets its grid (less
    the excluded configs) and runs at most the configs left."""
    sampler, n_trials = options.sampler, options.n_trials
    if sampler is None:
        return optuna.samplers.TPESampler(), n_trials
    if isinstance(sampler, functools.partial):  # GridSampler waits for its grid
        grid = {k: grid_values(k, d) for k, d in space.distributions.items()}
        size = math.prod(len(v) for v in grid.values())
        if options.rules:
            # every config is known: rules are judged on them all, as the grid sweeper does
            filtered = grid_filter.apply(_grid_configs(space, grid), options.rules)
            for warning in filtered.warnings():
                log.warning("furcate_optuna: %s", warning)
            size = len(filtered.kept)
        if size < n_trials:
            log.info("furcate_optuna: the grid has %d configs to run: n_trials is %d", size, size)
        return sampler(grid), min(n_trials, size)
    return sampler, n_trials


def _judge_rules(options: OptunaOptions, space: SearchSpace, seen: Mapping[str, Domain]) -> None:
    """Refuse a rule of the wrong type and warn about one that matches nothing. A param's
    key is judged on its distribution: a choice's options, an int range's values, a float
    range's bounds (an exact value inside a continuous interval is almost never sampled:
    a warning too). Another key is judged on the values the probes composed, unless a
    custom search space may set it."""
    domains: dict[str, Domain] = {}
    if options.custom_search_space is None:
        domains.update(seen)
    domains.update(space_domains(space))
    unmatched = unmatched_rules(options.rules, domains)
    refuse_wrong_types(unmatched, _SAMPLED)
    for miss in unmatched:
        log.warning("furcate_optuna: %s", unmatched_warning(miss, _SAMPLED))


def _probe_configs(space: SearchSpace) -> tuple[list[list[str]], bool]:
    """Configs with each choice of each categorical param, the other params at their first
    value; and whether every choice got one (at most ``_MAX_PROBES`` are composed)."""
    base = {k: _first_value(d) for k, d in space.distributions.items()}
    probes = [space.overrides(base)]
    for key, distribution in space.distributions.items():
        for choice in getattr(distribution, "choices", ())[1:]:
            if len(probes) >= _MAX_PROBES:
                return probes, False
            probes.append(space.overrides({**base, key: choice}))
    return probes, True


def _first_value(distribution: Any) -> Any:
    choices = getattr(distribution, "choices", None)
    return choices[0] if choices else distribution.low


def _grid_configs(space: SearchSpace, grid: dict[str, list[Any]]) -> list[list[str]]:
    keys = list(grid)
    return [
        space.overrides(dict(zip(keys, values, strict=True)))
        for values in itertools.product(*grid.values())
    ]
