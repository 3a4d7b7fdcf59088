"""Each trial's MLflow run (the launcher made it) gets the trial: number, state, values, epochs.

A run recorded this way is also how a later study learns a config's outcome without running
it: the launcher skips the FINISHED config and returns its value, and ``recorded`` says
whether that run's trial was PRUNED, with the values it reported per epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from optuna.trial import FrozenTrial

from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation

__all__ = ["RecordedTrial", "TrialRuns", "TrialTags"]

log = logging.getLogger(__name__)


class TrialTags:
    STUDY = "optuna.study_name"
    NUMBER = "optuna.trial_number"
    STATE = "optuna.state"
    VALUE = "optuna.value"  # metric; optuna.value.<i> with several directions
    INTERMEDIATE = "optuna.intermediate_value"  # metric, one step per reported epoch
    BEST_VALUE = "optuna.best_value"
    BEST_TRIAL = "optuna.best_trial"


@dataclass(frozen=True)
class RecordedTrial:
    state: str | None
    intermediate: dict[int, float] = field(default_factory=dict)


class TrialRuns:
    """Writes trials into the runs of the sweep's tracking store."""

    def __init__(self, tracking_uri: str, study_name: str) -> None:
        from mlflow.tracking import MlflowClient

        ignore_mlflow_sqlalchemy_deprecation()  # a SQL store warns when MLflow loads it
        self.client = MlflowClient(tracking_uri)
        self.study_name = study_name

    def annotate(self, run_id: str, trial: FrozenTrial) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        tags = {
            TrialTags.STUDY: self.study_name,
            TrialTags.NUMBER: str(trial.number),
            TrialTags.STATE: trial.state.name,
        }
        metrics = [
            Metric(TrialTags.INTERMEDIATE, float(value), now, int(step))
            for step, value in sorted(trial.intermediate_values.items())
        ]
        values = trial.values or []
        if len(values) == 1:
            metrics.append(Metric(TrialTags.VALUE, float(values[0]), now, 0))
        else:
            metrics += [
                Metric(f"{TrialTags.VALUE}.{i}", float(v), now, 0) for i, v in enumerate(values)
            ]
        try:
            self.client.log_batch(
                run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()]
            )
        except Exception as exc:  # the trial is told already; a lost tag is not worth a sweep
            log.warning(
                "furcate: could not record trial %d in run %s: %s", trial.number, run_id, exc
            )

    def recorded(self, run_id: str) -> RecordedTrial:
        """What an earlier trial recorded in this run (nothing, if no trial ran it)."""
        try:
            run = self.client.get_run(run_id)
            state = run.data.tags.get(TrialTags.STATE)
            history = (
                self.client.get_metric_history(run_id, TrialTags.INTERMEDIATE) if state else []
            )
        except Exception as exc:
            log.warning("furcate: could not read run %s: %s", run_id, exc)
            return RecordedTrial(None)
        return RecordedTrial(state, {int(m.step): float(m.value) for m in history})

    def log_results(
        self, sweep_run_id: str, paths: Iterable[Path], tags: Mapping[str, str]
    ) -> None:
        """The study's results and plots on the sweep's (parent) run."""
        try:
            for path in paths:
                self.client.log_artifact(sweep_run_id, str(path), artifact_path="optuna")
            for key, value in tags.items():
                self.client.set_tag(sweep_run_id, key, value)
        except Exception as exc:
            log.warning(
                "furcate: could not log the study's results to run %s: %s", sweep_run_id, exc
            )
