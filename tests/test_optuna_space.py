"""hydra-optuna-sweeper's search-space syntax becomes the Optuna distributions it means."""

from __future__ import annotations

import re
from typing import Any

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.sweeping.exclusion import parse_exclusions
from furcate_hydra.sweeping.rule_reach import Reach, unmatched_rules
from furcate_hydra.tuning.pruners import pruner_from_spec
from hydra_plugins.furcate_optuna_sweeper._space import (
    grid_values,
    override_line,
    parse_search_space,
    space_domains,
)
from hydra_plugins.furcate_optuna_sweeper.config import (
    HyperbandPrunerConf,
    MedianPrunerConf,
    NoPrunerConf,
    PercentilePrunerConf,
    SuccessiveHalvingPrunerConf,
)
from hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper import FurcateOptunaSweeper

PARSER = OverridesParser.create()


def space(**params: str) -> Any:
    return parse_search_space(params, [], PARSER)


@pytest.mark.parametrize(
    "value, expected",
    [
        # Hydra reads an interval's ends as floats; int(...) makes it integer
        ("interval(-5, 5)", FloatDistribution(-5.0, 5.0)),
        ("tag(log, interval(1e-5, 1.0))", FloatDistribution(1e-5, 1.0, log=True)),
        ("int(interval(1, 8))", IntDistribution(1, 8)),
        ("tag(log, int(interval(1, 64)))", IntDistribution(1, 64, log=True)),
        # hydra-optuna-sweeper's range: Optuna's stepped distribution, its end included
        ("range(1, 10)", IntDistribution(1, 10)),
        ("range(0, 10, step=2)", IntDistribution(0, 10, step=2)),
        ("range(10, 0, step=-2)", IntDistribution(0, 10, step=2)),
        ("range(-5.5, 5.5, step=0.5)", FloatDistribution(-5.5, 5.5, step=0.5)),
        ("range(0.5, 5.5, step=1)", FloatDistribution(0.5, 5.5, step=1.0)),  # sampled 5.5 there
        ("range(0, 1, step=0.1)", FloatDistribution(0.0, 1.0, step=0.1)),
        ("range(3, 3)", IntDistribution(3, 3)),
        ("choice(Adam, SGD)", CategoricalDistribution(["Adam", "SGD"])),
        ("32,64", CategoricalDistribution([32, 64])),
        ("choice(-5, 0, 5)", CategoricalDistribution([-5, 0, 5])),
    ],
)
def test_distributions(value: str, expected: Any) -> None:
    assert space(x=value).distributions == {"x": expected}


def test_exclusion_rules_are_judged_on_what_each_param_can_sample() -> None:
    # choices and int ranges are finite: a value outside them is never sampled; a float
    # range's bounds are known, and an exact value inside an interval almost never comes up
    searched = parse_search_space(
        {
            "y": "choice(-1, 0, 1)",
            "n": "int(interval(1, 8))",
            "batch": "range(32, 256, step=32)",
            "x": "interval(-2.0, 2.0)",
            "db/engine": "choice(sqlite, postgres)",
        },
        ["+model=choice(small,big)", "epochs=3"],
        PARSER,
    )
    domains = space_domains(searched)
    assert "epochs" not in domains  # fixed: judged on composed configs by the sweeper
    cases = [
        ({"y": 5}, Reach.NO_VALUE),
        ({"y": "abc"}, Reach.WRONG_TYPE),
        ({"y": "1"}, None),
        ({"n": 9}, Reach.NO_VALUE),
        ({"n": 2.5}, Reach.NO_VALUE),
        ({"n": True}, Reach.WRONG_TYPE),
        ({"batch": [48, 80]}, Reach.NO_VALUE),
        ({"batch": 96}, None),
        ({"x": 3.0}, Reach.NO_VALUE),
        ({"x": 0.5}, Reach.ALMOST_NEVER),
        ({"x": "abc"}, Reach.WRONG_TYPE),
        ({"model": "huge"}, Reach.NO_VALUE),  # a group choice, the "+" of its override aside
        ({"db.engine": "mysql"}, Reach.NO_VALUE),
        ({"db/engine": "sqlite"}, None),
    ]
    for rule, expected in cases:
        found = unmatched_rules(parse_exclusions([rule]), domains)
        assert (found[0].reach if found else None) is expected, rule


def test_a_shuffled_range_is_a_choice_of_the_values_hydra_lists() -> None:
    parsed = space(x="shuffle(range(1, 4))").distributions["x"]
    assert isinstance(parsed, CategoricalDistribution)
    assert sorted(parsed.choices) == [1, 2, 3]  # type: ignore[type-var]


def test_fixed_values_pass_through_and_the_command_line_wins() -> None:
    result = parse_search_space(
        {"x": "interval(0, 1.0)", "epochs": "10", "lr": "choice(0.1, 0.2)"},
        ["lr=tag(log, interval(1e-4, 1e-1))", "seed=3"],
        PARSER,
    )
    assert result.fixed == ("epochs=10", "seed=3")
    assert list(result.distributions) == ["x", "lr"]
    assert result.distributions["lr"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert result.overrides({"x": 0.25, "lr": 0.01}) == ["epochs=10", "seed=3", "x=0.25", "lr=0.01"]


@pytest.mark.parametrize(
    "value, expected, last",
    [
        ("range(0, 5.5, step=2)", FloatDistribution(0.0, 4.0, step=2.0), "4.0"),
        ("range(1, 10, step=4)", IntDistribution(1, 9, step=4), "9"),
        ("range(10, 1, step=-4)", IntDistribution(2, 10, step=4), "2"),  # from its start
    ],
)
def test_a_range_whose_steps_miss_its_end_ends_at_its_last_step_with_a_warning(
    value: str, expected: Any, last: str
) -> None:
    # what Optuna does to high (FloatDistribution(0, 5.5, step=2) has high 4.0), named here
    with pytest.warns(
        UserWarning, match=f"hydra.sweeper.params.x={re.escape(value)}: .* ends at {last} "
    ):
        parsed = space(x=value).distributions["x"]
    assert parsed == expected


@pytest.mark.parametrize(
    "value, message",
    [
        ("range(5, 1)", "never reaches 1 from 5 in steps of 1"),
        ("range(1, 5, step=0)", "never reaches 5 from 1 in steps of 0"),
        ("interval(5, 1)", "needs its low end below its high end"),
        ("tag(log, interval(0, 1.0))", "its low end must be above 0"),
        ("interval(0,", "is not a valid search space"),
    ],
)
def test_bad_search_spaces_name_the_key_and_the_fix(value: str, message: str) -> None:
    with pytest.raises(OptionError) as error:
        space(x=value)
    assert error.value.key == "hydra.sweeper.params.x"
    assert message in str(error.value) and "Fix:" in str(error.value)


@pytest.mark.parametrize(
    "value", ["Adam", "a b", "1", "true", "it's", "path/to:x", 1, -3, 0.001, 1e-7, True, None]
)
def test_override_lines_read_back_as_the_same_value(value: Any) -> None:
    (override,) = PARSER.parse_overrides([override_line("key", value)])
    assert override.value() == value
    assert type(override.value()) is type(value)


def test_grid_values_list_every_value_the_distribution_allows() -> None:
    parsed = space(
        x="range(-1.0, 1.0, step=0.5)",
        n="int(interval(1, 3))",
        o="choice(a, b)",
        t="range(0, 0.3, step=0.1)",
    )
    grids = {k: grid_values(k, d) for k, d in parsed.distributions.items()}
    assert grids == {
        "x": [-1.0, -0.5, 0.0, 0.5, 1.0],  # the range's end too, as TPE may sample it
        "n": [1, 2, 3],
        "o": ["a", "b"],
        "t": [0.0, 0.1, 0.2, 0.3],
    }
    with pytest.raises(OptionError, match="the grid sampler needs"):
        grid_values("lr", space(lr="interval(0.1, 1.0)").distributions["lr"])


@pytest.mark.parametrize(
    "conf, expected",
    [
        (MedianPrunerConf, optuna.pruners.MedianPruner),
        (PercentilePrunerConf, optuna.pruners.PercentilePruner),
        (SuccessiveHalvingPrunerConf, optuna.pruners.SuccessiveHalvingPruner),
        (HyperbandPrunerConf, optuna.pruners.HyperbandPruner),
        (NoPrunerConf, optuna.pruners.NopPruner),
    ],
)
def test_each_pruner_option_builds_its_optuna_pruner(conf: type, expected: type) -> None:
    # hydra/sweeper/pruner=<name> gives these values; sweeper and jobs build the pruner from them
    values = OmegaConf.to_container(OmegaConf.structured(conf))
    assert isinstance(values, dict)
    assert isinstance(pruner_from_spec({str(k): v for k, v in values.items()}), expected)


def test_a_pruner_furcate_optuna_does_not_offer_is_named_with_those_it_does() -> None:
    with pytest.raises(OptionError) as error:
        sweeper_options(pruner={"name": "wilcoxon"})
    message = str(error.value)
    assert "hydra.sweeper.pruner" in message and "wilcoxon" in message, message
    assert "hydra/sweeper/pruner=median (or percentile," in message, message


def sweeper_options(**options: Any) -> Any:
    return FurcateOptunaSweeper.parse_options({"pruner": {"name": "none"}, **options})


DEPRECATED = (
    r"`hydra.sweeper.search_space` is deprecated and will be removed in the next major "
    r"release. Please configure with `hydra.sweeper.params`: "
)


@pytest.mark.parametrize(
    "entry, expected",
    [
        # hydra-optuna-sweeper 1.2's own table of search_space entries and what they become
        ({"type": "categorical", "choices": [1, 2, 3]}, CategoricalDistribution([1, 2, 3])),
        ({"type": "int", "low": 0, "high": 10}, IntDistribution(0, 10)),
        ({"type": "int", "low": 0, "high": 10, "step": 2}, IntDistribution(0, 10, step=2)),
        ({"type": "int", "low": 1, "high": 100, "log": True}, IntDistribution(1, 100, log=True)),
        ({"type": "float", "low": 0, "high": 1}, FloatDistribution(0, 1)),
        ({"type": "float", "low": 0, "high": 10, "step": 2}, FloatDistribution(0, 10, step=2)),
        (
            {"type": "float", "low": 1, "high": 100, "log": True},
            FloatDistribution(1, 100, log=True),
        ),
        (
            {"type": "float", "low": -5.5, "high": 5.5, "step": 0.5},
            FloatDistribution(-5.5, 5.5, step=0.5),
        ),
        (
            {"type": "categorical", "choices": ["a b", True]},
            CategoricalDistribution(["a b", True]),
        ),
    ],
)
def test_the_deprecated_search_space_is_read_with_a_warning_that_shows_it_as_params(
    entry: dict[str, Any], expected: Any
) -> None:
    with pytest.warns(UserWarning, match=DEPRECATED) as warned:
        options = sweeper_options(search_space=OmegaConf.create({"x": entry}))
    assert options.search_space == {"x": expected}
    # the params the warning suggests are the same space
    suggested = str(warned[0].message).rpartition("`hydra.sweeper.params`: x: ")[2]
    assert space(x=suggested).distributions == {"x": expected}


def test_a_deprecated_entry_with_log_and_step_ignores_the_step_as_hydra_optuna_sweeper_does() -> (
    None
):
    entry = {"type": "float", "low": 1e-4, "high": 1.0, "log": True, "step": 0.1}
    with pytest.warns(UserWarning, match="log is set, so step 0.1 is ignored"):
        options = sweeper_options(search_space={"lr": entry})
    assert options.search_space == {"lr": FloatDistribution(1e-4, 1.0, log=True)}


def test_a_deprecated_step_that_misses_high_ends_at_its_last_step() -> None:
    with pytest.warns(UserWarning) as warned:
        options = sweeper_options(
            search_space={"n": {"type": "int", "low": 1, "high": 10, "step": 4}}
        )
    assert options.search_space == {"n": IntDistribution(1, 9, step=4)}
    assert any(
        "search_space.n=" in str(w.message) and "ends at 9" in str(w.message) for w in warned
    )


def test_the_command_line_joins_the_deprecated_search_space_and_wins() -> None:
    result = parse_search_space(
        {},
        ["x=0.5", "y=choice(1, 2)"],
        PARSER,
        search_space={"x": FloatDistribution(0.0, 1.0), "z": IntDistribution(1, 3)},
    )
    assert result.distributions == {
        "z": IntDistribution(1, 3),
        "y": CategoricalDistribution([1, 2]),
    }
    assert result.fixed == ("x=0.5",)


def test_hydra_deprecation_warnings_as_errors_refuses_the_deprecated_search_space(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS", "1")
    with pytest.raises(
        OptionError, match=re.escape("write it as hydra.sweeper.params: x: int(interval(1, 3))")
    ):
        sweeper_options(search_space={"x": {"type": "int", "low": 1, "high": 3}})
