"""Exclusion rules judged on each config as Hydra composes it, so defaults and group choices count.

Every config of the grid is composed here, before anything runs: a config that cannot be
composed fails the sweep at once (as Hydra's ``validate_batch_is_legal`` does), so does one
whose job would write outside the sweep dir (``job_dirs``), and a rule key found in no
composed config is refused as a typo. Rules that match no config are found too: one whose
values are all of a type the key never has is refused, the others are reported
(``FilteredGrid.unmatched``) for the sweeper to warn about. The composed values a rule reads
are kept per config, so an edit of the rules costs no composition unless it names new keys.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from furcate_hydra.hydra_api.options import OptionError, plain
from furcate_hydra.hydra_api.task_config import as_job
from furcate_hydra.launching.compose import SweepComposer
from furcate_hydra.launching.job_dirs import check_job_paths
from furcate_hydra.sweeping.exclusion import ABSENT, ConfigView, ExclusionRule, unknown_keys
from furcate_hydra.sweeping.rule_reach import Reach, UnmatchedRule, Values, unmatched_rules

__all__ = ["FilteredGrid", "GridFilter", "refuse_wrong_types", "unmatched_warning"]

log = logging.getLogger(__name__)

Config = tuple[str, ...]

# How messages name the configs a grid's rules are judged on.
OF_THE_GRID = "of the grid"


@dataclass(frozen=True)
class FilteredGrid:
    """The grid's configs that run, how many each rule excluded (first matching rule), and
    the rules that match no config."""

    kept: list[Config]
    total: int
    rules: tuple[ExclusionRule, ...] = ()
    excluded_by: Counter[ExclusionRule] = field(default_factory=Counter)
    unmatched: tuple[UnmatchedRule, ...] = ()

    @property
    def excluded(self) -> int:
        return self.total - len(self.kept)

    def describe(self) -> str:
        # "in the grid", not "to run": a rerun may find every one of them recorded already
        text = f"{len(self.kept)} of {self.total} configs in the grid"
        if not self.excluded:
            return text
        rules = ", ".join(f"{rule}: {self.excluded_by[rule]}" for rule in self.rules)
        return f"{text}, {self.excluded} excluded by hydra.sweeper.exclude ({rules})"

    def warnings(self) -> list[str]:
        """One line per rule that excludes nothing."""
        return [unmatched_warning(miss, OF_THE_GRID) for miss in self.unmatched]


class _Values:
    """The composed values of one config at the keys rules name (a ConfigView look-alike)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def get(self, key: str) -> Any:
        return self.values.get(key, ABSENT)

    def has(self, key: str) -> bool:
        return self.values.get(key, ABSENT) is not ABSENT


class GridFilter:
    """``apply(grid, rules)``: compose each config once, keep those no rule matches."""

    def __init__(self, hydra_context: HydraContext, master_config: DictConfig) -> None:
        self.composer = SweepComposer(hydra_context, master_config)
        self.sweep_dir = str(master_config.hydra.sweep.dir)
        self._values: dict[Config, dict[str, Any]] = {}
        # per config, why its job could not run where it would write (None: it can)
        self._path_errors: dict[Config, OptionError | None] = {}

    def forget(self) -> None:
        """The config files changed: compose from them again."""
        self.composer.forget()
        self._values.clear()
        self._path_errors.clear()

    def apply(
        self,
        grid: Sequence[Sequence[str]],
        rules: Sequence[ExclusionRule],
        whole: bool = True,
    ) -> FilteredGrid:
        """``whole``: ``grid`` is every config of the sweep, so a rule key none of them has
        is a typo, and a rule none of them matches excludes nothing. ``whole=False`` for
        part of a sweep (a sampled config), where neither can be told."""
        configs = [tuple(c) for c in grid]
        views = self._views(configs, rules, check_keys=whole)
        kept: list[Config] = []
        excluded_by: Counter[ExclusionRule] = Counter()
        for config, view in zip(configs, views, strict=True):
            rule = next((r for r in rules if r.matches(view)), None)
            if rule is None:
                kept.append(config)
            else:
                excluded_by[rule] += 1
        for config in kept:  # a config that never runs may write anywhere
            if (error := self._path_errors.get(config)) is not None:
                raise error
        unmatched: list[UnmatchedRule] = []
        if whole:
            domains = _domains(views, rules)
            unmatched = unmatched_rules(rules, domains, views, matched=excluded_by)
            refuse_wrong_types(unmatched, OF_THE_GRID)
        return FilteredGrid(kept, len(configs), tuple(rules), excluded_by, tuple(unmatched))

    def probe(
        self, configs: Sequence[Sequence[str]], rules: Sequence[ExclusionRule]
    ) -> dict[str, Values]:
        """Compose configs that stand for a space too large to list (an Optuna search space:
        one config per choice): refuse a rule key none of them has, and a job dir outside the
        sweep dir; return the values they hold at each rule key."""
        views = self._views([tuple(c) for c in configs], rules, check_keys=True)
        for config in configs:
            if (error := self._path_errors.get(tuple(config))) is not None:
                raise error
        return _domains(views, rules)

    def _views(
        self, configs: Sequence[Config], rules: Sequence[ExclusionRule], check_keys: bool
    ) -> list[_Values]:
        keys = list(dict.fromkeys(key for rule in rules for key in rule.keys))
        views = [self._view(config, keys, num) for num, config in enumerate(configs)]
        if check_keys and (unknown := unknown_keys(rules, views)):
            index = next(i for i, rule in enumerate(rules) if unknown[0] in rule.keys)
            raise OptionError(
                f"hydra.sweeper.exclude[{index}]",
                unknown[0],
                "names a key that is in no config of the sweep (neither a config key nor a "
                "config group)",
                "check the spelling against the composed config (python <app>.py --cfg job); "
                "keys are dotted paths such as model.width, or group names such as optimizer",
            )
        return views

    def _view(self, config: Config, keys: Sequence[str], num: int) -> _Values:
        known = self._values.get(config)
        if known is None or any(key not in known for key in keys):
            # Composing also proves the config composes, before any job runs.
            sweep_config = self.composer.compose(list(config))
            known = self._values[config] = self._read(sweep_config, config, keys)
            if config not in self._path_errors:
                self._path_errors[config] = self._path_error(sweep_config, config, num)
        return _Values(known)

    def _path_error(self, sweep_config: DictConfig, config: Config, num: int) -> OptionError | None:
        # The number a job gets is decided when it starts; a path's place does not depend on
        # its digits, so the config's place in the grid stands in for it.
        with open_dict(sweep_config):
            sweep_config.hydra.job.num = num
            sweep_config.hydra.job.id = num
        label = f"the config {' '.join(config)}" if config else "the config with no overrides"
        try:
            with as_job(sweep_config):
                check_job_paths(sweep_config, self.sweep_dir, label)
        except OptionError as exc:
            return exc
        return None

    @staticmethod
    def _read(sweep_config: DictConfig, config: Config, keys: Sequence[str]) -> dict[str, Any]:
        choices = OmegaConf.to_container(sweep_config.hydra.runtime.choices)
        assert isinstance(choices, dict)
        view = ConfigView(sweep_config, {str(k): v for k, v in choices.items()})
        values: dict[str, Any] = {}
        with as_job(sweep_config):
            for key in keys:
                try:
                    value = view.get(key)
                except Exception as exc:  # an interpolation that cannot be resolved
                    raise OptionError(
                        "hydra.sweeper.exclude",
                        key,
                        f"cannot be read in the config of {' '.join(config) or 'no overrides'} "
                        f"({type(exc).__name__}: {exc})",
                        "exclude on a key whose value composes without the job's runtime",
                    ) from None
                if value is not ABSENT:
                    values[key] = plain(value)
        return values


def refuse_wrong_types(unmatched: Sequence[UnmatchedRule], where: str) -> None:
    """Refuse the first rule whose values a key can never equal: no edit of the sweep's
    values makes it match, so it is a mistake in the rule."""
    for miss in unmatched:
        if miss.reach is Reach.WRONG_TYPE:
            raise OptionError(
                f"hydra.sweeper.exclude[{miss.index}].{miss.key}",
                miss.shown_value(),
                f"can never match, so the rule excludes nothing: {miss.why(where)}",
                f"write the value as {miss.key} has it in the configs, or drop the rule",
            )


def unmatched_warning(miss: UnmatchedRule, where: str) -> str:
    """The warning for a rule that excludes nothing (or, on a continuous interval, almost)."""
    head = f"hydra.sweeper.exclude[{miss.index}] {miss.rule}"
    if miss.reach is Reach.ALMOST_NEVER:
        return f"{head} will almost never exclude anything: {miss.why(where)}"
    return f"{head} matches no config {where}, so it excludes nothing: {miss.why(where)}"


def _domains(views: Sequence[_Values], rules: Sequence[ExclusionRule]) -> dict[str, Values]:
    """The values the configs hold at each rule key (keys none of them has left out)."""
    keys = dict.fromkeys(key for rule in rules for key in rule.keys)
    domains = {
        key: Values.distinct(v.values[key] for v in views if key in v.values) for key in keys
    }
    return {key: domain for key, domain in domains.items() if domain.values}
