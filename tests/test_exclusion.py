"""Exclusion rules: furcate's exclude_configs semantics on composed configs."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.sweeping.exclusion import ConfigView, parse_exclusions, unknown_keys


def view(choices: dict[str, Any] | None = None, **config: Any) -> ConfigView:
    return ConfigView(config, choices or {})


def test_the_furcate_readme_case_keeps_25_of_30_configs() -> None:
    rules = parse_exclusions(
        [
            {"optimizer": "Adadelta", "batch_size": 32},
            {"optimizer": "SGD", "learning_rate": 0.001},
        ]
    )
    grid = itertools.product(
        [0.0001, 0.001, 0.00001], ["RMSProp", "SGD", "Adam", "Nadam", "Adadelta"], [32, 64]
    )
    kept = [
        (lr, opt, bs)
        for lr, opt, bs in grid
        if not any(r.matches(view(learning_rate=lr, optimizer=opt, batch_size=bs)) for r in rules)
    ]
    assert len(kept) == 25
    assert (0.001, "SGD", 64) not in kept and (0.001, "Adadelta", 32) not in kept
    assert (0.0001, "SGD", 32) in kept and (0.001, "Adadelta", 64) in kept


def test_every_pair_of_a_rule_must_match() -> None:
    (rule,) = parse_exclusions([{"optimizer": "SGD", "batch_size": 32}])
    assert rule.matches(view(optimizer="SGD", batch_size=32))
    assert not rule.matches(view(optimizer="SGD", batch_size=64))
    assert not rule.matches(view(optimizer="Adam", batch_size=32))


def test_a_list_means_any_of() -> None:
    (rule,) = parse_exclusions([{"optimizer": ["SGD", "Adadelta"], "batch_size": 32}])
    assert rule.matches(view(optimizer="Adadelta", batch_size=32))
    assert rule.matches(view(optimizer="SGD", batch_size=32))
    assert not rule.matches(view(optimizer="Adam", batch_size=32))
    assert str(rule) == "{optimizer in ['SGD', 'Adadelta'], batch_size=32}"


def test_dotted_and_nested_keys_reach_into_the_config() -> None:
    dotted, nested = parse_exclusions([{"model.width": 8}, {"model": {"depth": [3, 4]}}])
    assert dotted.keys == ("model.width",) and nested.keys == ("model.depth",)
    config = view(model={"width": 8, "depth": 3})
    assert dotted.matches(config) and nested.matches(config)
    assert not dotted.matches(view(model={"width": 16, "depth": 1}))


def test_group_choices_match_by_name_and_values_from_defaults_count() -> None:
    (rule,) = parse_exclusions([{"model": "big", "trainer.precision": 16}])
    # model is a config group: its choice, not the composed node, is compared.
    composed = view({"model": "big"}, model={"width": 64}, trainer={"precision": 16})
    assert rule.matches(composed)
    assert not rule.matches(view({"model": "small"}, model={"width": 8}, trainer={"precision": 16}))
    (nested_group,) = parse_exclusions([{"model.encoder": "cnn"}])
    assert nested_group.matches(view({"model/encoder": "cnn"}, model={"encoder": {"k": 3}}))


def test_numbers_match_across_spellings_but_not_booleans() -> None:
    (rule,) = parse_exclusions([{"learning_rate": "1e-3", "flag": True}])
    assert rule.matches(view(learning_rate=0.001, flag=True))
    assert not rule.matches(view(learning_rate=0.001, flag=1))
    (text,) = parse_exclusions([{"name": "adam"}])
    assert not text.matches(view(name="Adam"))


def test_unknown_keys_are_the_ones_no_config_has() -> None:
    rules = parse_exclusions([{"optimizer": "SGD", "model.depth": 3}, {"optimiser": "SGD"}])
    views = [view(optimizer="SGD", model={"width": 8}), view(optimizer="SGD", model={"depth": 3})]
    # model.depth exists under one of the group choices: known. optimiser is a typo.
    assert unknown_keys(rules, views) == ["optimiser"]


@pytest.mark.parametrize(
    ("raw", "key", "shown"),
    [
        ({"optimizer": "SGD"}, "hydra.sweeper.exclude", "{'optimizer': 'SGD'}"),
        ("optimizer=SGD", "hydra.sweeper.exclude", "'optimizer=SGD'"),
        ([{}], "hydra.sweeper.exclude[0]", "{}"),
        ([{"a": 1}, "b"], "hydra.sweeper.exclude[1]", "'b'"),
        ([{"a": []}], "hydra.sweeper.exclude[0].a", "[]"),
    ],
)
def test_malformed_rules_are_named(raw: Any, key: str, shown: str) -> None:
    with pytest.raises(FurcateConfigError) as caught:
        parse_exclusions(raw)
    message = str(caught.value)
    assert message.startswith(f"Invalid {key}={shown}:") and "Fix:" in message


def test_no_rules() -> None:
    assert parse_exclusions(None) == [] and parse_exclusions([]) == []
