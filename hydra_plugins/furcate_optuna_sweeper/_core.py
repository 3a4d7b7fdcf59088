"""Run an Optuna study on the launcher's slots: a trial per free slot, told the moment it ends.

open study (shared storage) ──► recover trials of dead sweeps ──► n_trials - counted to run
furcate launcher:  ask ──► excluded? (FAIL, not counted, ask again) ──► submit on a free slot
                   wait_any ──► tell (COMPLETE / PRUNED / FAIL) ──► ask the next at once
other launchers:   ask n_jobs ──► launch() the batch ──► tell all ──► next batch
each trial's job:  reports its monitored metric per epoch to the trial (OptunaPruning)
end: optimization_results.yaml + plots in the sweep dir, on the sweep's MLflow run;
     every trial of the study failed: an error of one line (_all_failed)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, filter_overrides
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.hydra_api.options import OptionError, as_option_error, plain
from furcate_hydra.launching.streaming import JobRequest, StreamingLauncher, as_streaming
from furcate_hydra.layout import SweepPaths
from furcate_hydra.sweepers.exclusion_filter import (
    GridFilter,
    refuse_wrong_types,
    unmatched_warning,
)
from furcate_hydra.sweepers.storage_proxy import sweeper_storage_proxy
from furcate_hydra.sweepers.sweep_returns import ReturnBatch, SweepReturns
from furcate_hydra.sweepers.sweeper_base import SweepContext, save_multirun_config
from furcate_hydra.sweeping.rule_reach import Domain, unmatched_rules
from furcate_hydra.tuning.optuna_private import storage_of, trial_id
from hydra_plugins.furcate_optuna_sweeper._all_failed import FailedTrial, every_trial_failed
from hydra_plugins.furcate_optuna_sweeper._in_flight import trials_in_flight
from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
from hydra_plugins.furcate_optuna_sweeper._outcome import TrialOutcome, read_outcome
from hydra_plugins.furcate_optuna_sweeper._results import write_results
from hydra_plugins.furcate_optuna_sweeper._space import (
    SearchSpace,
    grid_values,
    override_line,
    parse_search_space,
    space_domains,
)
from hydra_plugins.furcate_optuna_sweeper._study import (
    Attrs,
    ask_owned,
    counts,
    open_study,
    owned_running,
    recover_trials,
    shown_url,
    study_storage,
    sweeper_identity,
)
from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialRuns

if TYPE_CHECKING:
    from furcate_hydra.tuning.prune_service import PruneService

__all__ = ["run_study"]

log = logging.getLogger(__name__)

# Configs composed up front to check job dirs and exclusion keys: one per choice of each
# categorical param.
_MAX_PROBES = 64
# How messages name the configs exclusion rules are judged on, without a grid to list them.
_SAMPLED = "the search space can sample"


@dataclass
class TrialJob:
    trial: optuna.Trial
    num: int
    task: tuple[str, ...]  # the overrides of the task's config
    env: dict[str, str]  # the job's trial, for its pruning callback
    label: str

    def request(self) -> JobRequest:
        """The job for a streaming launcher, which sets the trial's variables itself."""
        return JobRequest(self.task, self.num, self.env)

    def batch_overrides(self) -> list[str]:
        """The job for any launcher: Hydra's ``hydra.job.env_set`` takes it its trial.

        ``++``: env_set is a struct of str, which takes a new key only this way (and a key the
        user set is overwritten, not an error).
        """
        env = [override_line(f"++hydra.job.env_set.{k}", v) for k, v in self.env.items()]
        return [*self.task, *env]


class StudySweep:
    """One sweep's study: asks trials as jobs, tells their returns, counts toward n_trials."""

    def __init__(
        self, options: OptunaOptions, context: SweepContext, arguments: Sequence[str]
    ) -> None:
        self.options = options
        hydra_context, config = context.hydra_context, context.config
        self.config = config
        self.launcher = context.launcher
        self.streaming = as_streaming(context.launcher)
        parser = OverridesParser.create(config_loader=hydra_context.config_loader)
        self.space = parse_search_space(
            dict(options.params), arguments, parser, options.search_space
        )
        self.filter = GridFilter(hydra_context, config)
        grid_sampler = isinstance(options.sampler, functools.partial)
        self._check_before_trials(judge_rules=not grid_sampler)
        sampler, n_trials = self._sampler(options.sampler, options.n_trials)
        self.study_name = options.study_name or str(config.hydra.job.name)
        self.storage = study_storage(options.storage, SweepPaths.of(str(config.hydra.sweep.dir)))
        # jobs on other machines report to the study (pruning): it must be reachable there,
        # a sqlite file through the proxy `serving` starts
        self._serve_at = sweeper_storage_proxy(
            plain(config.hydra.get("launcher")),
            "hydra.sweeper.storage",
            self.storage,
            options.storage_proxy,
        )
        self.job_storage = self.storage  # what the trials' jobs open
        self._prune_service: PruneService | None = None  # while trials run here (serving)
        self.study = open_study(
            self.storage,
            self.study_name,
            options.directions,
            sampler,
            options.pruner_object(),
            options.objective_names,
        )
        self._identity = sweeper_identity()
        state = recover_trials(self.study, self._identity, self.space.distributions)
        self._reseed(config, sampler)
        self.n_trials = n_trials
        self.to_start = max(0, n_trials - state.counted)
        self.started = self.told = self.pruned = 0
        self.best: str | None = None  # for the progress view: "0.0123 (trial 7)"
        self._best_value: float | None = None
        self.failed = 0
        self.first_error: BaseException | None = None  # of the first trial told failed
        self.first_failed: FailedTrial | None = None  # the lowest-numbered, for the last line
        self.returns = SweepReturns()  # on disk: nothing per finished trial held here
        self.next_num = 0
        pruning = (
            f"pruner {options.pruner['name']} on {options.monitor}"
            if options.monitor
            else "no pruning (hydra.sweeper.monitor unset)"
        )
        done = f"{state.counted} of {n_trials} trials already in the study"
        if state.retried:
            done += f", {state.retried} interrupted ones re-tried"
        where = shown_url(self.storage)
        if options.storage is None:
            where += " (storage: null: a new study for this run)"
        log.info(
            "furcate_optuna: study %r in %s: %s, %d to run (%s, %s, direction %s)",
            self.study_name,
            where,
            done,
            self.to_start,
            type(sampler).__name__,
            pruning,
            ", ".join(options.directions),
        )

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While the trials run: pruning decided here for jobs on this machine, or the sqlite
        study served to the Ray nodes, if they need it."""
        if self._serve_at is None:
            with self._deciding_pruning():
                yield
            return
        from furcate_hydra.tuning.proxy import StudyProxy

        host, port = self._serve_at
        try:
            proxy = StudyProxy(self.storage, host, port, "hydra.sweeper.storage_proxy")
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        self.job_storage = proxy.url
        log.info(
            "furcate_optuna: the study is served to the Ray nodes at %s (Optuna's gRPC proxy "
            "in front of %s)",
            proxy.url,
            shown_url(self.storage),
        )
        try:
            yield
        finally:
            proxy.stop()
            self.job_storage = self.storage
            log.info("furcate_optuna: stopped serving the study at %s", proxy.url)

    @contextlib.contextmanager
    def _deciding_pruning(self) -> Iterator[None]:
        """The prune service (tuning/prune_service.py), where jobs run on this machine under
        furcate's launcher and a monitored metric can prune a single-objective study."""
        launcher = plain(self.config.hydra.get("launcher")) or {}
        local = self.streaming is not None and launcher.get("backend", "local") == "local"
        if not (local and self.options.monitor and len(self.options.directions) == 1):
            yield
            return
        from furcate_hydra.tuning.prune_service import PruneService

        self._prune_service = PruneService()
        log.debug("furcate_optuna: jobs report to %s", self._prune_service.url)
        try:
            yield
        finally:
            self._prune_service.stop()
            self._prune_service = None

    @functools.cached_property
    def runs(self) -> TrialRuns | None:
        """The trials' MLflow runs, with the furcate launcher recording; looked up on first use,
        since asking the launcher starts its pool."""
        tracking = self.streaming.tracking_uri if self.streaming is not None else None
        return TrialRuns(tracking, self.study_name) if tracking else None

    # -- asking ------------------------------------------------------------------------

    def recount(self) -> None:
        """Trials that other sweeps of the study asked since it opened (launchers sharing its
        storage, a job array's) count toward n_trials as this sweep's do: what it still starts
        shrinks by them. Sweeps that ask at the same moment may each start the last one."""
        counted = sum(1 for t in self.study.get_trials(deepcopy=False) if counts(t))
        self.to_start = min(self.to_start, self.started + max(0, self.n_trials - counted))

    def ask(self) -> tuple[optuna.Trial, list[str]]:
        """The next trial and its task's overrides, resampled while exclusion rules match."""
        for _ in range(self.options.max_resamples):
            trial = ask_owned(self.study, self.space.distributions, self._identity)
            try:
                task = self._task_overrides(trial)
                rule = self._excluded_by(task)
                if rule is None:
                    self._copy_reports_of_retried(trial)
                    self.started += 1
                    return trial, task
            except BaseException as exc:  # Ctrl-C while asking: no trial is left RUNNING
                self.interrupted([trial], f"sweep stopped: {type(exc).__name__}")
                raise
            self._set_attr(trial, Attrs.EXCLUDED, rule)
            self.study.tell(trial, state=TrialState.FAIL)
            log.info("furcate_optuna: trial %d excluded by %s, resampling", trial.number, rule)
        raise OptionError(
            "hydra.sweeper.exclude",
            [str(rule) for rule in self.options.rules],
            f"matched {self.options.max_resamples} sampled configs in a row: the search space "
            "left by the exclusions is empty, or too small for the sampler to find",
            "loosen hydra.sweeper.exclude or widen hydra.sweeper.params; raise "
            "hydra.sweeper.max_resamples if the space left is small but not empty",
        )

    def _task_overrides(self, trial: optuna.Trial) -> list[str]:
        for line in self.space.fixed:
            key, _, value = line.partition("=")
            trial.set_user_attr(key, value)
        extender = self.options.custom_search_space
        if extender is not None:
            extender(self.config, trial)
        fixed_keys = {line.partition("=")[0] for line in self.space.fixed}
        if overlap := sorted(fixed_keys & set(trial.params)):
            self.study.tell(trial, state=TrialState.FAIL)
            raise OptionError(
                "hydra.sweeper.custom_search_space",
                overlap,
                "suggests params that hydra.sweeper.params fixes",
                "suggest them only in one place",
            )
        params = trial.params
        ordered = [
            *self.space.distributions,
            *(k for k in params if k not in self.space.distributions),
        ]
        return [*self.space.fixed, *(override_line(k, params[k]) for k in ordered)]

    def _excluded_by(self, task: list[str]) -> str | None:
        if not self.options.rules:
            return None
        result = self.filter.apply([task], self.options.rules, whole=False)
        if result.kept:
            return None
        return str(next(iter(result.excluded_by)))

    def job(self, trial: optuna.Trial, task: list[str], leader: TrialJob | None = None) -> TrialJob:
        """The trial as a job with the next job number; a follower shares its leader's."""
        num = leader.num if leader is not None else self.next_num
        if leader is None:
            self.next_num += 1
        label = " ".join(filter_overrides(task)) or "no overrides"
        return TrialJob(
            trial,
            num,
            tuple(task),
            self._trial_env(trial),
            f"job #{num} (trial {trial.number}: {label})",
        )

    def _trial_env(self, trial: optuna.Trial) -> dict[str, str]:
        """What the job's pruning callback reads to report to its trial (nothing to report
        without a monitored metric)."""
        if self.options.monitor is None:
            return {}
        env = {
            env_vars.OPTUNA_STORAGE: self.job_storage,
            env_vars.OPTUNA_STUDY: self.study_name,
            env_vars.OPTUNA_TRIAL_NUMBER: str(trial.number),
            env_vars.OPTUNA_MONITOR: self.options.monitor,
            env_vars.OPTUNA_PRUNER: self.options.pruner_json(),
        }
        if self._prune_service is not None:
            self._prune_service.add(trial)
            env[env_vars.OPTUNA_PRUNE_URL] = self._prune_service.url
        return env

    def _copy_reports_of_retried(self, trial: optuna.Trial) -> None:
        """A re-tried trial's job resumes at the epoch its predecessor reached: the pruner
        must see the epochs reported before the interruption too."""
        number = trial.user_attrs.get(Attrs.RETRY_OF)
        if not isinstance(number, int):
            return
        storage = trial.storage
        study_id = storage.get_study_id_from_name(self.study.study_name)
        old_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        for step, value in sorted(storage.get_trial(old_id).intermediate_values.items()):
            trial.report(value, step)

    # -- telling -----------------------------------------------------------------------

    def tell(
        self, job: TrialJob, job_return: JobReturn, key: str, leader: TrialJob | None = None
    ) -> TrialOutcome:
        """Tell the trial its job's outcome. A follower (sampled while a trial with the same
        config ran) is told its leader's outcome, which the leader was told first."""
        trial = job.trial
        if self._prune_service is not None:  # its job has ended: it reports no more
            self._prune_service.discard(trial)
        run_id, skipped = (None, False)
        if self.streaming is not None:
            run = self.streaming.job_run(key)
            run_id, skipped = run.run_id, run.skipped
        storage = trial.storage
        if leader is not None:
            ran = storage.get_trial(trial_id(leader.trial))
            self._set_attr(trial, Attrs.FROM_RECORD, run_id or f"trial {ran.number}")
            for step, value in sorted(ran.intermediate_values.items()):
                trial.report(value, step)
            pruned = ran.state is TrialState.PRUNED
            log.info("furcate_optuna: trial %d told from trial %d", trial.number, ran.number)
        elif skipped and run_id is not None and self.runs is not None:
            recorded = self.runs.recorded(run_id)
            self._set_attr(trial, Attrs.FROM_RECORD, run_id)
            for step, value in sorted(recorded.intermediate.items()):
                trial.report(value, step)
            pruned = recorded.state == TrialState.PRUNED.name
            log.info(
                "furcate_optuna: trial %d told from MLflow run %s (%s)",
                trial.number,
                run_id,
                recorded.state or "FINISHED",
            )
        else:
            attrs = storage.get_trial(trial_id(trial)).system_attrs
            pruned = env_vars.PRUNED_AT_EPOCH_ATTR in attrs
            if pruned and self.streaming is not None:  # ran here: the summary names its epoch
                epoch = attrs[env_vars.PRUNED_AT_EPOCH_ATTR]
                self.streaming.job_pruned(key, epoch if isinstance(epoch, int) else None)
        outcome = read_outcome(job_return, self.options.directions, job.label, pruned)
        if run_id is not None:
            trial.set_user_attr(Attrs.MLFLOW_RUN, run_id)
        if outcome.error is not None:
            trial.set_user_attr(Attrs.ERROR, str(outcome.error).splitlines()[0][:500])
        values = outcome.values if outcome.state is TrialState.COMPLETE else None
        try:
            self.study.tell(trial, values=values, state=outcome.state)
        except RuntimeError as exc:
            # GridSampler stops the study once its grid is done, which Optuna refuses outside
            # optimize(); the trial is told by then.
            if "Study.stop" not in str(exc):
                raise
        self.told += 1
        self.pruned += outcome.state is TrialState.PRUNED
        self._note_best(
            trial.number, outcome.values if outcome.state is TrialState.COMPLETE else None
        )
        if not outcome.failed:
            shown = outcome.values if outcome.values is not None else "no value"
            log.info("furcate_optuna: trial %d %s: %s", trial.number, outcome.state.name, shown)
        if leader is None:
            self.returns.add(job.num, job_return)
        if self.runs is not None and run_id is not None and not skipped and leader is None:
            self.runs.annotate(run_id, storage.get_trial(trial_id(trial)))
        if outcome.failed:
            assert outcome.error is not None
            self.failed += 1
            self.first_error = self.first_error or outcome.error
            if self.first_failed is None or trial.number < self.first_failed.number:
                self.first_failed = FailedTrial.of(trial.number, job.num, job_return, outcome.error)
            log.warning("furcate_optuna: trial %d failed: %s", trial.number, outcome.error)
        return outcome

    def interrupted(self, trials: Sequence[optuna.Trial], why: str) -> None:
        """Trials stopped before their jobs ended: FAIL, marked for a retry by the next sweep
        (a trial told already is left as it was told). Besides ``trials``, every other trial
        this sweeper asked that is still RUNNING: an interrupt inside an ask, or between an
        ask and the job's submission (frequent while trials are asked ahead of busy slots),
        leaves one in no list."""
        storage = storage_of(self.study)
        ids = [trial_id(trial) for trial in trials]
        try:
            ids += [
                trial_id(frozen)
                for frozen in owned_running(self.study, self._identity)
                if trial_id(frozen) not in ids
            ]
        except Exception as exc:  # still stopping: the next sweep recovers them as dead
            log.warning("furcate_optuna: trials asked but not yet submitted left RUNNING: %s", exc)
        for an_id in ids:
            name = f"with id {an_id}"
            try:
                frozen = storage.get_trial(an_id)
                name = str(frozen.number)
                if frozen.state.is_finished():
                    continue
                storage.set_trial_system_attr(an_id, Attrs.INTERRUPTED, why)
                self.study.tell(frozen.number, state=TrialState.FAIL, skip_if_finished=True)
            except Exception as exc:  # still stopping: the next sweep recovers it as dead
                log.warning("furcate_optuna: trial %s left RUNNING: %s", name, exc)

    def too_many_failures(self, concurrency: int) -> bool:
        """hydra-optuna-sweeper's max_failure_rate, judged per trial: at 0 the first failure
        stops the sweep; above 0 once a slot-full of trials has been told."""
        if not self.failed:
            return False
        rate = self.options.max_failure_rate
        if rate == 0:
            return True
        return self.told >= concurrency and self.failed / self.told > rate

    # -- setup -------------------------------------------------------------------------

    def _sampler(self, sampler: Any, n_trials: int) -> tuple[Any, int]:
        if sampler is None:
            return optuna.samplers.TPESampler(), n_trials
        if isinstance(sampler, functools.partial):  # GridSampler waits for its grid
            grid = {k: grid_values(k, d) for k, d in self.space.distributions.items()}
            size = math.prod(len(v) for v in grid.values())
            if self.options.rules:
                # every config is known: rules are judged on them all, as the grid sweeper does
                filtered = self.filter.apply(_grid_configs(self.space, grid), self.options.rules)
                for warning in filtered.warnings():
                    log.warning("furcate_optuna: %s", warning)
                size = len(filtered.kept)
            if size < n_trials:
                log.info(
                    "furcate_optuna: the grid has %d configs to run: n_trials is %d", size, size
                )
            return sampler(grid), min(n_trials, size)
        return sampler, n_trials

    def _reseed(self, config: DictConfig, sampler: Any) -> None:
        """A seeded sampler would repeat the samples of the study's first sweep in every rerun
        (each MLflow-recorded, so told without running, yet asked again): a rerun seeds it
        with the seed plus the study's trial count, still reproducible."""
        seed = OmegaConf.select(config, "hydra.sweeper.sampler.seed")
        known = len(self.study.get_trials(deepcopy=False))
        if seed is None or not known or isinstance(sampler, optuna.samplers.GridSampler):
            return
        from hydra.utils import instantiate

        self.study.sampler = instantiate(config.hydra.sweeper.sampler, seed=int(seed) + known)
        log.info("furcate_optuna: sampler seeded with %d + %d trials in the study", seed, known)

    def _check_before_trials(self, judge_rules: bool) -> None:
        """Before the first trial: refuse a job dir outside the sweep dir and a rule key in no
        config (a typo), on one config per choice of each categorical param (a group choice
        decides which keys exist); then, unless a grid sampler lists every config, judge the
        rules against the search space (``_judge_rules``)."""
        rules = self.options.rules
        probes, complete = _probe_configs(self.space)
        seen = self.filter.probe(probes if rules else probes[:1], rules)
        if rules and judge_rules:
            self._judge_rules(seen if complete else {})

    def _judge_rules(self, seen: Mapping[str, Domain]) -> None:
        """Refuse a rule of the wrong type and warn about one that matches nothing. A param's
        key is judged on its distribution: a choice's options, an int range's values, a float
        range's bounds (an exact value inside a continuous interval is almost never sampled:
        a warning too). Another key is judged on the values the probes composed, unless a
        custom search space may set it."""
        domains: dict[str, Domain] = {}
        if self.options.custom_search_space is None:
            domains.update(seen)
        domains.update(space_domains(self.space))
        unmatched = unmatched_rules(self.options.rules, domains)
        refuse_wrong_types(unmatched, _SAMPLED)
        for miss in unmatched:
            log.warning("furcate_optuna: %s", unmatched_warning(miss, _SAMPLED))

    def _note_best(self, number: int, values: Sequence[float] | None) -> None:
        # one objective: the best value so far; several: Optuna's Pareto front has no one best
        if values is None or len(self.options.directions) != 1:
            return
        value = float(values[0])
        better = self._best_value is None or (
            value < self._best_value
            if self.options.directions[0] == "minimize"
            else value > self._best_value
        )
        if better:
            self._best_value = value
            self.best = f"{value:.6g} (trial {number})"

    def _set_attr(self, trial: optuna.Trial, key: str, value: Any) -> None:
        trial.storage.set_trial_system_attr(trial_id(trial), key, value)


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
    import itertools

    keys = list(grid)
    return [
        space.overrides(dict(zip(keys, values, strict=True)))
        for values in itertools.product(*grid.values())
    ]


def run_study(
    options: OptunaOptions, context: SweepContext, arguments: Sequence[str]
) -> list[ReturnBatch]:
    """Run the trials the study is missing; write and log its results; returns in job order."""
    sweep = StudySweep(options, context, arguments)
    sweep_dir = save_multirun_config(context.config).sweep_dir
    streaming = sweep.streaming
    if sweep.to_start:
        with sweep.serving():
            if options.asynchronous and streaming is not None:
                _stream(sweep, streaming)
            else:
                _batches(sweep, context.launcher)
    # a study of failed trials has no results: its one line is the error below
    all_failed = every_trial_failed(sweep.study, sweep.first_failed)
    results = write_results(sweep.study, sweep_dir) if all_failed is None else None
    ran = sweep.started > 0 and streaming is not None
    sweep_run = streaming.sweep_run_id if ran and streaming and sweep.runs else None
    if results is not None and sweep_run and sweep.runs is not None:
        sweep.runs.log_results(sweep_run, results.files, results.tags)
    if sweep.first_error is not None and sweep.too_many_failures(1):
        log.error(
            "furcate_optuna: %d of %d trials failed (hydra.sweeper.max_failure_rate=%s)",
            sweep.failed,
            sweep.told,
            options.max_failure_rate,
        )
        raise sweep.first_error
    if all_failed is not None:  # after the records: the launcher wrote them as the trials ended
        raise all_failed
    return sweep.returns.batches(None)


def _stream(sweep: StudySweep, launcher: StreamingLauncher) -> None:
    """Every free slot runs a trial, and (with a trial per slot) the next trial of each slot is
    asked and submitted ahead while the slots are busy: when a trial ends, its slot's next one
    starts at once, and the end is told after. A sampler that sees running trials (TPE's
    constant liar, on by default) counts the trials asked ahead as running ones."""
    in_flight: dict[str, TrialJob] = {}
    # trials sampled with the config of a running trial, by its job number: told its outcome,
    # not run twice
    followers: dict[int, list[TrialJob]] = {}
    stopping = False
    submitting: list[TrialJob] = []  # asked, not yet in_flight: stopped, they are told too
    try:
        with launcher.streaming():
            concurrency = trials_in_flight(
                sweep.options.n_jobs,
                launcher.slot_count,
                sweep.to_start - sweep.started,
                batches=False,
            )
            # ahead only where every slot runs a trial: else a trial asked ahead would start
            # on a free slot, beyond n_jobs
            every_slot = concurrency >= launcher.slot_count
            ahead = min(concurrency, launcher.jobs_ahead) if every_slot else 0
            while in_flight or (sweep.started < sweep.to_start and not stopping):
                done: list[tuple[str, JobReturn]] = []
                room = (concurrency + ahead if in_flight else concurrency) - len(in_flight)
                if room > 0 and sweep.started < sweep.to_start and not stopping:
                    submitting = _ask_jobs(sweep, room, [*in_flight.values()], followers)
                    if submitting:
                        keys = launcher.submit_batch([job.request() for job in submitting])
                        in_flight.update(zip(keys, submitting, strict=True))
                        submitting = []
                    done = launcher.wait_any(timeout=0)  # a recorded config comes back at once
                else:
                    done = launcher.wait_any()
                for key, job_return in done:
                    job = in_flight.pop(key)
                    sweep.tell(job, job_return, key)
                    for follower in followers.pop(job.num, []):
                        sweep.tell(follower, job_return, key, leader=job)
                    if not stopping and sweep.too_many_failures(concurrency):
                        stopping = True
                        log.error(
                            "furcate_optuna: too many failed trials (hydra.sweeper."
                            "max_failure_rate=%s): no new trial starts, %d running go on",
                            sweep.options.max_failure_rate,
                            len(in_flight),
                        )
                to_come = 0 if stopping else sweep.to_start - sweep.started
                launcher.sweep_status(to_come=to_come, best=sweep.best, pruned=sweep.pruned)
    except BaseException as exc:
        waiting = [job for jobs in followers.values() for job in jobs]
        held = [*in_flight.values(), *waiting, *submitting]
        sweep.interrupted([job.trial for job in held], f"sweep stopped: {type(exc).__name__}")
        raise


def _ask_jobs(
    sweep: StudySweep,
    room: int,
    running: list[TrialJob],
    followers: dict[int, list[TrialJob]],
) -> list[TrialJob]:
    """Up to ``room`` new trials as jobs, submitted in one batch (one store lookup); a trial
    sampled with the config of one running or in this batch follows it instead."""
    jobs: list[TrialJob] = []
    asked = 0
    try:
        while asked < room and sweep.started < sweep.to_start:
            sweep.recount()
            if sweep.started >= sweep.to_start:
                break
            trial, task = sweep.ask()
            asked += 1
            leader = next((j for j in [*running, *jobs] if j.task == tuple(task)), None)
            if leader is not None:
                followers.setdefault(leader.num, []).append(sweep.job(trial, task, leader))
                continue
            jobs.append(sweep.job(trial, task))
    except BaseException as exc:
        sweep.interrupted([job.trial for job in jobs], f"sweep stopped: {type(exc).__name__}")
        raise
    return jobs


def _batches(sweep: StudySweep, launcher: Launcher) -> None:
    """hydra-optuna-sweeper's loop: ask a batch, launch it, wait for all of it, tell it."""
    if sweep.streaming is None:  # another launcher: its slots are unknown here
        size = sweep.options.n_jobs or 1
    else:
        size = trials_in_flight(
            sweep.options.n_jobs, sweep.streaming.slot_count, sweep.to_start, batches=True
        )
    while sweep.started < sweep.to_start:
        sweep.recount()
        count = min(size, sweep.to_start - sweep.started)
        if count <= 0:
            break
        jobs: list[TrialJob] = []
        try:
            for _ in range(count):
                jobs.append(sweep.job(*sweep.ask()))
            results = launcher.launch([job.batch_overrides() for job in jobs], jobs[0].num)
        except BaseException as exc:
            sweep.interrupted([job.trial for job in jobs], f"sweep stopped: {type(exc).__name__}")
            raise
        for job, job_return in zip(jobs, results, strict=True):
            # the furcate launcher keys a job by its number, in launch() as in submit()
            sweep.tell(job, job_return, str(job.num))
        if sweep.too_many_failures(len(jobs)):
            return
