"""Exclusion rules that can match no config: which ones, and why (the Hydra-free core)."""

from __future__ import annotations

from typing import Any

import pytest

from furcate_hydra.sweeping.exclusion import ConfigView, parse_exclusions
from furcate_hydra.sweeping.rule_reach import (
    Domain,
    NumberRange,
    Reach,
    Values,
    could_equal,
    unmatched_rules,
)


def reach(rule: dict[str, Any], domains: dict[str, Domain], configs: Any = None) -> Reach | None:
    found = unmatched_rules(parse_exclusions([rule]), domains, configs)
    return found[0].reach if found else None


@pytest.mark.parametrize(
    "actual, wanted, can",
    [
        (3, "abc", False),  # the case: a string no number equals
        (3, "3", True),  # a string of digits is a number to a rule
        (3, 1e-3, True),
        ("Adam", 3, True),  # some string could be "3"
        ("Adam", True, False),  # a boolean matches only a boolean
        (True, 1, False),
        (None, 0, False),
        (None, None, True),
        ({"width": 8}, "big", False),  # a mapping is no value a rule can name
        ([1, 2], [1, 2], True),
    ],
)
def test_which_types_could_ever_be_equal(actual: Any, wanted: Any, can: bool) -> None:
    assert could_equal(actual, wanted) is can


def test_a_value_of_the_right_type_missing_from_the_grid_is_a_typo_of_a_value() -> None:
    sleep = Values.distinct([0, 0.01, 0, 0.01])
    assert sleep.values == (0, 0.01)
    assert reach({"sleep": 0.5}, {"sleep": sleep}) is Reach.NO_VALUE
    assert reach({"sleep": "abc"}, {"sleep": sleep}) is Reach.WRONG_TYPE
    # a list is "any of": one value of the right type makes it a value typo, one that occurs
    # makes the rule match
    assert reach({"sleep": ["abc", 0.5]}, {"sleep": sleep}) is Reach.NO_VALUE
    assert reach({"sleep": ["abc", 1e-2]}, {"sleep": sleep}) is None
    assert reach({"other": "abc"}, {"sleep": sleep}) is None  # a key without a domain: not judged


def test_the_worst_key_of_a_rule_decides() -> None:
    domains: dict[str, Domain] = {
        "sleep": Values((0, 0.01)),
        "model": Values(("small", "big")),
        "x": NumberRange(-2.0, 2.0),
    }
    assert reach({"x": 0.5, "sleep": 9, "model": True}, domains) is Reach.WRONG_TYPE
    assert reach({"x": 0.5, "sleep": 9}, domains) is Reach.NO_VALUE
    assert reach({"x": 0.5, "sleep": 0}, domains) is Reach.ALMOST_NEVER


def test_values_that_never_occur_together_are_found_where_every_config_is_known() -> None:
    configs = [ConfigView({"width": w}, {"model": m}) for m, w in [("small", 8), ("big", 64)]]
    domains: dict[str, Domain] = {"model": Values(("small", "big")), "width": Values((8, 64))}
    rule = {"model": "big", "width": 8}
    assert reach(rule, domains, configs) is Reach.NOT_TOGETHER
    assert reach(rule, domains) is None  # without the configs it cannot be told
    assert reach({"model": "big", "width": 64}, domains, configs) is None
    # a rule known to match is not looked at again
    rules = parse_exclusions([rule])
    assert unmatched_rules(rules, domains, configs, matched=rules) == []


@pytest.mark.parametrize(
    "domain, holds, misses",
    [
        (NumberRange(1, 8, 1, integer=True), [1, 8, "3", 4.0], [0, 9, 2.5]),
        (NumberRange(32, 256, 32, integer=True), [32, 64, 256], [33, 288, 16]),
        (NumberRange(0.0, 1.0, 0.1), [0.0, 0.3, "0.7", 1], [0.25, 1.1]),
        (NumberRange(1e-5, 1e-1, log=True), [1e-3, 0.1], [0.0, 1.0]),
    ],
)
def test_a_number_range_holds_its_steps_only(
    domain: NumberRange, holds: list[Any], misses: list[Any]
) -> None:
    assert all(domain.holds(value) for value in holds)
    assert not any(domain.holds(value) for value in misses)
    assert not domain.holds(True) and not domain.could_hold("abc")


def test_messages_name_the_rule_the_key_and_its_values() -> None:
    domains: dict[str, Domain] = {
        "sleep": Values((0, 0.01)),
        "n": NumberRange(1, 8, 1, integer=True),
        "x": NumberRange(-2.0, 2.0),
    }
    rules = parse_exclusions([{"sleep": "abc"}, {"n": 9}, {"x": 0.5}])
    wrong, missing, inexact = unmatched_rules(rules, domains)
    assert (wrong.index, wrong.key, wrong.shown_value()) == (0, "sleep", "abc")
    assert wrong.why("of the grid") == (
        "sleep is a number in every config of the grid (0, 0.01), which 'abc' (a string) "
        "can never equal"
    )
    assert missing.why("of the grid") == "n is an integer from 1 to 8 in the configs of the grid"
    assert "x is a number sampled from the interval [-2.0, 2.0]" in inexact.why("sampled")
    many = Values(tuple(range(12)))
    assert str(many) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, … (12 in all)"
