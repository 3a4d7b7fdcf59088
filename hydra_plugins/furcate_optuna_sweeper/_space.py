"""hydra-optuna-sweeper's search-space syntax, read with Hydra's parser, as Optuna distributions.

    x: interval(-5, 5)              FloatDistribution (Hydra reads an interval's ends as floats)
    lr: tag(log, interval(1e-5, 1)) log-uniform
    n: int(interval(1, 8))          IntDistribution
    x: range(-5.5, 5.5, step=0.5)   stepped, -5.5 to 5.5 with both ends (see below)
    opt: choice(Adam, SGD)          CategoricalDistribution (also a,b and glob(*) over groups)
    epochs: 10                      fixed: passed to every trial unchanged

``range(a, b, step=s)`` means what it means to hydra-optuna-sweeper, Optuna's stepped
distribution from ``a`` to ``b`` with ``b`` included, not Hydra's grid range (``b`` left out,
as the grid sweeper keeps it): the same config searches the same space under either plugin.
Where no step lands on ``b``, the last step before it ends the space, as Optuna adjusts ``high``
(and warns). ``shuffle(range(...))`` stays Hydra's list of values, as a choice.

A sampled value goes back to Hydra as an override (``override_line``), so a trial's job is
composed exactly as a grid job with the same values would be.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    Glob,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)

from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.sweepers.grid import parse_sweep_overrides
from furcate_hydra.sweeping.rule_reach import Domain, NumberRange, Values

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = [
    "SearchSpace",
    "grid_values",
    "override_line",
    "parse_search_space",
    "space_domains",
    "stepped_distribution",
]

# Strings that read back as themselves in a Hydra override without quotes.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]*")
_KEYWORDS = {"true", "false", "null", "nan", "inf", "int", "float", "str", "bool", "json_str"}


@dataclass(frozen=True)
class SearchSpace:
    """What Optuna samples (key -> distribution) and the overrides every trial gets as they are."""

    distributions: dict[str, BaseDistribution]
    fixed: tuple[str, ...]

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's overrides: the fixed ones, then one per sampled key in search-space order."""
        return [*self.fixed, *(override_line(k, params[k]) for k in self.distributions)]


def parse_search_space(
    params: Mapping[str, str],
    arguments: Sequence[str],
    parser: OverridesParser,
    search_space: Mapping[str, BaseDistribution] | None = None,
) -> SearchSpace:
    """``hydra.sweeper.params`` first, then the command line, which wins for a key in both.

    ``search_space`` (the deprecated ``hydra.sweeper.search_space``, as distributions) comes
    before both, as in hydra-optuna-sweeper: a key they set too takes their value.
    """
    parsed = parse_sweep_overrides(
        params.items(),
        arguments,
        parser,
        "is not a valid search space",
        "use interval(0.1, 1), tag(log, interval(1e-5, 1)), int(interval(1, 8)), "
        "range(1, 10), choice(a, b) or a fixed value",
    )
    distributions: dict[str, BaseDistribution] = dict(search_space or {})
    fixed: list[str] = []
    winners = {override.get_key_element(): (source, override) for source, override in parsed}
    for key, (source, override) in winners.items():
        if override.is_sweep_override():
            distributions[key] = _distribution(source, override)
            continue
        distributions.pop(key, None)
        if override.is_delete():
            fixed.append(override.input_line or key)
        else:
            fixed.append(f"{key}={override.get_value_element_as_str()}")
    return SearchSpace(distributions, tuple(fixed))


def grid_values(key: str, distribution: BaseDistribution) -> list[Any]:
    """Every value of a discrete distribution, for Optuna's GridSampler."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    step = getattr(distribution, "step", None)
    if isinstance(distribution, IntDistribution) and not distribution.log and step:
        return list(range(distribution.low, distribution.high + 1, step))
    if isinstance(distribution, FloatDistribution) and step:
        count = round((distribution.high - distribution.low) / step) + 1
        # from the low end each time, so float steps do not add up errors
        return [round(distribution.low + i * step, 12) for i in range(count)]
    raise OptionError(
        f"hydra.sweeper.params.{key}",
        repr(distribution),
        "has no list of values, which the grid sampler needs",
        "use range(...) or choice(...) for this key, or another sampler (e.g. "
        "hydra/sweeper/sampler=tpe)",
    )


def space_domains(space: SearchSpace) -> dict[str, Domain]:
    """What a sampled config holds at each param's config key, for judging exclusion rules:
    a choice's options, or an int or float distribution's range (the key both as a dotted
    config key and as a config group, ``db.engine`` and ``db/engine``)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    domains: dict[str, Domain] = {}
    for key, distribution in space.distributions.items():
        domain: Domain
        if isinstance(distribution, CategoricalDistribution):
            domain = Values.distinct(distribution.choices)
        elif isinstance(distribution, IntDistribution | FloatDistribution):
            domain = NumberRange(
                distribution.low,
                distribution.high,
                distribution.step,
                integer=isinstance(distribution, IntDistribution),
                log=distribution.log,
            )
        else:
            continue
        name = key.lstrip("+~").partition("@")[0]
        domains[name.replace("/", ".")] = domains[name.replace(".", "/")] = domain
    return domains


def stepped_distribution(
    source: str, text: Any, start: float, stop: float, step: float, *, integer: bool
) -> BaseDistribution:
    """Every value ``start + k * step`` from ``start`` up to ``stop`` included, as an Int- or
    FloatDistribution with ``step`` (whose ``low`` is the smaller end, for a step below 0).

    The caller checked that ``step`` goes from ``start`` towards ``stop``. Where no step lands
    on ``stop``, the last one before it ends the space: Optuna adjusts ``high`` the same way
    and warns; so does this, naming the option. Decimal arithmetic, as Optuna's, so that
    ``0.1`` steps land where they are written.
    """
    from optuna.distributions import FloatDistribution, IntDistribution

    begin, end, size = (Decimal(str(v)) for v in (start, stop, step))
    last = begin + (end - begin) // size * size
    if last != end:
        warnings.warn(
            f"{source}={text}: steps of {step} from {start} do not land on {stop}, so the "
            f"search space ends at {_number(last, integer)} (Optuna ends a stepped "
            "distribution at its last step the same way)",
            UserWarning,
            stacklevel=2,
        )
    low, high = sorted((begin, last))
    if integer:
        return IntDistribution(int(low), int(high), step=int(abs(size)))
    return FloatDistribution(float(low), float(high), step=float(abs(size)))


def _number(value: Decimal, integer: bool) -> int | float:
    return int(value) if integer else float(value)


def override_line(key: str, value: Any) -> str:
    """``key=value`` such that Hydra reads ``value`` back with its type."""
    if isinstance(value, str):
        plain = _PLAIN.fullmatch(value) and value.lower() not in _KEYWORDS
        if not plain:
            value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return f"{key}={value}"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if value is None:
        return f"{key}=null"
    return f"{key}={value!r}"


def _distribution(source: str, override: Override) -> BaseDistribution:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    sweep = override.value()
    text = (override.input_line or "").partition("=")[2]
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        assert low is not None and high is not None
        log = "log" in sweep.tags
        if not low < high:
            raise OptionError(
                source, text, "needs its low end below its high end", "write interval(low, high)"
            )
        if log and low <= 0:
            raise OptionError(
                source, text, "is log-scaled, so its low end must be above 0", "e.g. 1e-5"
            )
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    if isinstance(sweep, RangeSweep) and not sweep.shuffle:
        start, stop, step = sweep.start, sweep.stop, sweep.step
        assert start is not None and stop is not None
        if step == 0 or (stop - start) * step < 0:
            raise OptionError(
                source,
                text,
                f"never reaches {stop} from {start} in steps of {step}",
                f"e.g. range({min(start, stop)}, {max(start, stop)}, step={abs(step) or 1}), "
                "with its end included",
            )
        integer = all(isinstance(v, int) for v in (start, stop, step))
        return stepped_distribution(source, text, start, stop, step, integer=integer)
    if isinstance(sweep, ChoiceSweep | RangeSweep | Glob):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        if not choices:
            raise OptionError(source, text, "lists no values", "e.g. choice(a, b)")
        return CategoricalDistribution(choices)  # type: ignore[arg-type]
    raise OptionError(
        source,
        text,
        "is not a search space Optuna can sample",
        "use interval(...), tag(log, interval(...)), range(...) or choice(...)",
    )
