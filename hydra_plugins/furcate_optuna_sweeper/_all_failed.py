"""A study whose every trial failed ends its sweep with an error of one line.

hydra-optuna-sweeper reads ``study.best_trial`` at the end, which raises "No trials are
completed yet" when every trial failed (at ``max_failure_rate: 1.0`` the sweep gets that far).
Here the same study ends the same way, after the sweep's records are written, with a line
that names the count, the first failure and its logs. Only the trials that count toward
``n_trials`` are judged: excluded and interrupted ones are not failures of the task. A PRUNED
trial is not a failure either: a study of pruned trials (and failed ones) ends without error,
with the warning that it has no results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf
from optuna.trial import TrialState

from furcate_hydra.layout import JobPaths
from furcate_hydra.reasons import one_line_reason
from hydra_plugins.furcate_optuna_sweeper._study import Attrs, counts

__all__ = ["FailedTrial", "StudyFailedError", "every_trial_failed"]


class StudyFailedError(CompactHydraException):
    """Every trial of the study failed: there is no best trial to report."""


@dataclass(frozen=True)
class FailedTrial:
    """A failure told in this sweep, as the closing line names it."""

    number: int  # the trial's
    job: int
    reason: str
    logs: str | None

    @classmethod
    def of(cls, number: int, job: int, job_return: JobReturn, error: BaseException) -> FailedTrial:
        text = f"{type(error).__name__}: {error}"
        output_dir: Any = None
        if job_return.hydra_cfg is not None:
            output_dir = OmegaConf.select(job_return.hydra_cfg, "hydra.runtime.output_dir")
        logs = str(JobPaths.of(output_dir).logs) if isinstance(output_dir, str) else None
        return cls(number, job, one_line_reason(text) or text, logs)


def every_trial_failed(study: optuna.Study, first: FailedTrial | None) -> StudyFailedError | None:
    """The error to end the sweep with where every trial of the study that counts failed;
    ``first`` is this sweep's first failure (None: named from the study, as a rerun that ran
    nothing finds it)."""
    trials = [t for t in study.get_trials(deepcopy=False) if counts(t)]
    if not trials or any(t.state is not TrialState.FAIL for t in trials):
        return None
    if first is not None:
        where = f"; logs: {first.logs}" if first.logs else ""
        named = f"trial {first.number} (job #{first.job}): {first.reason}{where}"
    else:
        oldest = min(trials, key=lambda t: t.number)
        reason = oldest.user_attrs.get(Attrs.ERROR) or "no error recorded"
        run = oldest.user_attrs.get(Attrs.MLFLOW_RUN)
        named = f"trial {oldest.number}: {reason}" + (f" (MLflow run {run})" if run else "")
        # nothing ran: its failed trials count toward n_trials, so rerunning runs nothing
        named += (
            ". Fix the task, then start another study (hydra.sweeper.study_name=<new name>) "
            "or raise hydra.sweeper.n_trials"
        )
    which = f"all {len(trials)} trials" if len(trials) > 1 else "the one trial"
    return StudyFailedError(
        f"furcate_optuna: {which} of study {study.study_name!r} failed, none completed: no "
        f"best params. The first failure: {named}"
    )
