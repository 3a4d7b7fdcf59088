"""One sweep's study: trials asked as jobs, their outcomes told, counted toward n_trials.

open the study (shared storage) ──► recover trials of dead sweeps ──► n_trials - counted to run
ask ──► excluded? (FAIL, not counted, ask again) ──► a TrialJob (the job's env: its trial)
tell ──► read from the job's return, its MLflow record (skipped), or its leader (same config)
     ──► COMPLETE / PRUNED / FAIL, counted in the tally
stopped ──► every trial it asked and did not tell: FAIL, re-tried by the next sweep
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, filter_overrides
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from furcate_hydra import env_vars
from furcate_hydra.hydra_api.options import OptionError
from furcate_hydra.launching.streaming import JobRequest, as_streaming
from furcate_hydra.layout import SweepPaths
from furcate_hydra.sweepers.exclusion_filter import GridFilter
from furcate_hydra.sweepers.sweep_returns import SweepReturns
from furcate_hydra.sweepers.sweeper_base import SweepContext
from furcate_hydra.tuning.optuna_private import storage_of, trial_id
from hydra_plugins.furcate_optuna_sweeper._before_trials import check_before_trials, study_sampler
from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
from hydra_plugins.furcate_optuna_sweeper._outcome import TrialOutcome, read_outcome
from hydra_plugins.furcate_optuna_sweeper._space import override_line, parse_search_space
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
from hydra_plugins.furcate_optuna_sweeper._tally import TrialTally
from hydra_plugins.furcate_optuna_sweeper._trial_reporting import TrialReporting
from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialRuns

__all__ = ["StudySweep", "TrialJob"]

log = logging.getLogger(__name__)


@dataclass
class TrialJob:
    """A trial as a job: its number, its task's overrides, and the env that tells its pruning
    callback which trial it reports to."""

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
        check_before_trials(options, self.space, self.filter)
        sampler, n_trials = study_sampler(options, self.space, self.filter)
        self.study_name = options.study_name or str(config.hydra.job.name)
        self.storage = study_storage(options.storage, SweepPaths.of(str(config.hydra.sweep.dir)))
        self.reporting = TrialReporting(
            options, config, self.storage, self.study_name, streaming=self.streaming is not None
        )
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
        self.started = 0
        self.tally = TrialTally(options.directions, options.max_failure_rate)
        self.returns = SweepReturns()  # on disk: nothing per finished trial held here
        self.next_num = 0
        self._log_opened(state.counted, state.retried, sampler)

    def _log_opened(self, counted: int, retried: int, sampler: Any) -> None:
        options = self.options
        pruning = (
            f"pruner {options.pruner['name']} on {options.monitor}"
            if options.monitor
            else "no pruning (hydra.sweeper.monitor unset)"
        )
        done = f"{counted} of {self.n_trials} trials already in the study"
        if retried:
            done += f", {retried} interrupted ones re-tried"
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
            self.reporting.env(trial),
            f"job #{num} (trial {trial.number}: {label})",
        )

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
        self.reporting.ended(trial)
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
        self.tally.count(trial.number, job.num, job_return, outcome)
        if leader is None:
            self.returns.add(job.num, job_return)
        if self.runs is not None and run_id is not None and not skipped and leader is None:
            self.runs.annotate(run_id, storage.get_trial(trial_id(trial)))
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

    def _set_attr(self, trial: optuna.Trial, key: str, value: Any) -> None:
        trial.storage.set_trial_system_attr(trial_id(trial), key, value)
