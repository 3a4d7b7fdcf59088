"""The study in its shared storage: opened or resumed, trials left behind by dead sweeps recovered.

A rerun counts what the study already has toward ``n_trials`` and runs only what is missing:

    COMPLETE, PRUNED, FAIL (the task failed)     count
    RUNNING, of a sweeper that is still alive      counts (that sweeper tells it)
    RUNNING, of a sweeper that is gone             → FAIL, marked interrupted, then re-tried
    FAIL, interrupted (Ctrl-C, SIGTERM, killed)    does not count; re-tried once, same params
                                                   (one stopped before all its params were
                                                   sampled never ran: it is not re-tried)
    FAIL, excluded by hydra.sweeper.exclude        does not count

A re-tried trial is enqueued with its params, so the next ``ask`` returns it; its job finds
the interrupted MLflow run and resumes it from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from furcate_hydra.addresses import shown_url
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.liveness import LauncherIdentity, launcher_gone
from furcate_hydra.store.run_record import RunRecord, RunStatus
from furcate_hydra.tuning.optuna_private import asked, storage_of, trial_id
from furcate_hydra.tuning.storage import check_sqlite_storage, rdb_storage
from hydra_plugins.furcate_optuna_sweeper._options import job_storage_url

__all__ = [
    "Attrs",
    "StudyState",
    "ask_owned",
    "counts",
    "name_objectives",
    "open_study",
    "owned_running",
    "recover_trials",
    "shown_url",
    "study_storage",
]

log = logging.getLogger(__name__)


class Attrs:
    """Trial system attributes the sweeper writes (and the job: PRUNED_AT_EPOCH)."""

    SWEEPER = "furcate:sweeper"  # JSON of the asking sweeper's LauncherIdentity tags
    INTERRUPTED = "furcate:interrupted"  # why a trial was stopped before its job ended
    EXCLUDED = "furcate:excluded"  # the exclusion rule a sampled config matched
    FROM_RECORD = "furcate:from_mlflow_run"  # told from this recorded run, not run
    MLFLOW_RUN = "mlflow_run_id"  # user attr: the job's run, shown by optuna-dashboard
    ERROR = "furcate_error"  # user attr: why a failed trial's job failed, its first line
    # user attr of an enqueued retry: the interrupted trial's number (a finished trial cannot
    # be marked, so this is how a rerun knows the trial was re-tried already)
    RETRY_OF = "furcate_retry_of"


@dataclass(frozen=True)
class StudyState:
    """What a study already holds toward ``n_trials``."""

    counted: int
    running_elsewhere: int
    retried: int
    recovered: int


def study_storage(storage: str | None, sweep: SweepPaths) -> str:
    """The URL the sweeper and the trials' jobs open.

    A URL as given, a relative sqlite path made absolute (jobs may run elsewhere). ``None``
    (``storage: null``): a new sqlite file in the sweep dir. hydra-optuna-sweeper's study is in
    memory then, new every run; a file is what the trials' jobs can report to from their own
    processes, so pruning works, and the study stays beside the sweep's results.
    """
    if storage is not None:
        return job_storage_url(storage, Path.cwd())
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{sweep.new_study_db()}"


def open_study(
    storage_url: str,
    study_name: str,
    directions: Sequence[str],
    sampler: Any,
    pruner: Any,
    metric_names: Sequence[str] | None = None,
) -> optuna.Study:
    """Create the study, or load it with the same name; its directions must not change.

    ``metric_names`` name the study's values once (see ``name_objectives``). A damaged sqlite
    file is refused before Optuna opens (and writes into) it.
    """
    from furcate_hydra.hydra_api.options import OptionError, as_option_error

    try:
        check_sqlite_storage(storage_url, "hydra.sweeper.storage")
    except FurcateConfigError as exc:
        raise as_option_error(exc) from None
    study = optuna.create_study(
        storage=rdb_storage(storage_url),
        study_name=study_name,
        directions=[StudyDirection[d.upper()] for d in directions],
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,  # an existing study keeps the directions it was created with
    )
    had = [d.name.lower() for d in study.directions]
    if had != list(directions):
        raise OptionError(
            "hydra.sweeper.direction",
            list(directions),
            f"differs from the directions study {study_name!r} in {storage_url} was created "
            f"with ({had})",
            "keep the study's directions, or start another study with "
            "hydra.sweeper.study_name=<new name>",
        )
    if metric_names is not None:
        name_objectives(study, metric_names)
    return study


def name_objectives(study: optuna.Study, names: Sequence[str]) -> None:
    """Name the study's values (optuna-dashboard's axes, ``trials_dataframe``'s columns),
    unless the study has names already: those stay, and a warning says so when they differ."""
    had = study.metric_names
    if had is None:
        with warnings.catch_warnings():
            # experimental since Optuna 3.2, and still so; the warning says nothing to a user
            warnings.filterwarnings(
                "ignore", r".*\bset_metric_names is experimental", ExperimentalWarning
            )
            study.set_metric_names(list(names))
    elif list(had) != list(names):
        log.warning(
            "furcate_optuna: study %r names its values %s; kept (not %s, which a study takes "
            "once: start another study with hydra.sweeper.study_name=<new name> to use them)",
            study.study_name,
            list(had),
            list(names),
        )


def sweeper_identity() -> str:
    """This process's identity as a trial's SWEEPER attr: who to ask whether it still runs."""
    return json.dumps(LauncherIdentity.current().tags(), sort_keys=True)


def ask_owned(
    study: optuna.Study, distributions: Mapping[str, BaseDistribution], owner: str
) -> optuna.Trial:
    """``study.ask``, but the trial is never RUNNING without its sweeper's identity, and no
    trial is left WAITING.

    A plain ask makes the trial RUNNING and the identity is written after it: a sweep killed
    in between leaves a RUNNING trial no rerun can tell is orphaned. So a queued retry (which
    carries its enqueuer's identity) is claimed as ``ask`` pops one, and otherwise the new
    trial is created RUNNING with this identity in one write. Nothing else is queued: a
    queued trial another sweeper of the study may pop (a job array's launchers ask at once)
    is one that may be left behind, WAITING for good, when the study has all its trials.
    """
    storage = storage_of(study)
    claimed = _claim_waiting(study, storage)
    if claimed is None:
        template = create_trial(state=TrialState.RUNNING, system_attrs={Attrs.SWEEPER: owner})
        study_id = storage.get_study_id_from_name(study.study_name)
        claimed = storage.create_new_trial(study_id, template_trial=template)
    else:
        storage.set_trial_system_attr(claimed, Attrs.SWEEPER, owner)
    return asked(study, claimed, distributions)


def _claim_waiting(study: optuna.Study, storage: BaseStorage) -> int | None:
    """The id of the first queued trial this call made RUNNING, as ``ask`` pops one (a rival
    that took it first makes it try the next); None when none is queued."""
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(trial_id(waiting), state=TrialState.RUNNING):
                return trial_id(waiting)
        except UpdateFinishedTrialError:
            continue
    return None


def owned_running(study: optuna.Study, owner: str) -> list[FrozenTrial]:
    """The trials ``owner`` asked (``ask_owned``) that are RUNNING."""
    return [
        trial
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if trial.system_attrs.get(Attrs.SWEEPER) == owner
    ]


def recover_trials(study: optuna.Study, owner: str, params: Collection[str]) -> StudyState:
    """Fail the trials of dead sweeps, enqueue interrupted ones again, count the rest.

    ``params``: the names of the search space. A trial interrupted inside its ask has only some
    of them; it never ran, so there is nothing to re-try with the same params, and the next
    asks sample whole trials instead.
    """
    here = LauncherIdentity.current()
    storage = storage_of(study)
    recovered = 0
    running_elsewhere = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = _gone(trial, here)
        if why is None:
            running_elsewhere += 1
            continue
        storage.set_trial_system_attr(trial_id(trial), Attrs.INTERRUPTED, why)
        storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
        recovered += 1
        log.warning(
            "furcate: trial %d of study %r was left RUNNING (%s): marked failed, re-tried",
            trial.number,
            study.study_name,
            why,
        )
    trials = study.get_trials(deepcopy=False)
    done = {t.user_attrs.get(Attrs.RETRY_OF) for t in trials}
    retried = 0
    for trial in trials:
        if trial.state is not TrialState.FAIL or Attrs.INTERRUPTED not in trial.system_attrs:
            continue
        if trial.number in done or not set(params) <= trial.params.keys():
            continue
        study.enqueue_trial(dict(trial.params), user_attrs={Attrs.RETRY_OF: trial.number})
        _claim_retry(study, trial.number, owner)
        retried += 1
    counted = sum(1 for t in study.get_trials(deepcopy=False) if counts(t))
    return StudyState(counted, running_elsewhere, retried, recovered)


def _claim_retry(study: optuna.Study, number: int, owner: str) -> None:
    # enqueue_trial returns nothing: find the retry to give it the enqueuer's identity, which
    # it keeps while RUNNING until its popper claims it (see ask_owned)
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if waiting.user_attrs.get(Attrs.RETRY_OF) == number:
            storage_of(study).set_trial_system_attr(trial_id(waiting), Attrs.SWEEPER, owner)


def counts(trial: FrozenTrial) -> bool:
    """Does this trial count toward n_trials (see the module docstring)?"""
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING):
        return True
    if trial.state is TrialState.FAIL:
        attrs = trial.system_attrs
        return Attrs.INTERRUPTED not in attrs and Attrs.EXCLUDED not in attrs
    return False  # WAITING: enqueued, counted once asked


def _gone(trial: FrozenTrial, here: LauncherIdentity) -> str | None:
    text = trial.system_attrs.get(Attrs.SWEEPER)
    if not isinstance(text, str):
        return None  # not asked by a furcate sweeper: whoever asked it tells it
    try:
        tags = dict(json.loads(text))
    except ValueError:
        return None
    record = RunRecord("", "", RunStatus.RUNNING, 0, tags)
    # No heartbeat in the study: a sweep on another machine is judged alive. Its trials are
    # recovered from that machine, or by hand (optuna's storage API), if it died.
    return launcher_gone(record, here, heartbeat=time.time(), now=time.time(), stale_after_s=1e9)
