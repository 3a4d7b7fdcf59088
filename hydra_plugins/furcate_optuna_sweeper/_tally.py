"""What the sweep counts of the outcomes it told: the progress view's best and pruned, the
failures that ``max_failure_rate`` judges, and the first failure the sweep ends with."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hydra.core.utils import JobReturn
from optuna.trial import TrialState

from hydra_plugins.furcate_optuna_sweeper._all_failed import FailedTrial
from hydra_plugins.furcate_optuna_sweeper._outcome import TrialOutcome

__all__ = ["TrialTally"]

log = logging.getLogger(__name__)


class TrialTally:
    """Counts of the trials this sweep told, and its best result so far."""

    def __init__(self, directions: Sequence[str], max_failure_rate: float) -> None:
        self.directions = list(directions)
        self.max_failure_rate = max_failure_rate
        self.told = self.pruned = self.failed = 0
        self.best: str | None = None  # for the progress view: "0.0123 (trial 7)"
        self._best_value: float | None = None
        self.first_error: BaseException | None = None  # of the first trial told failed
        self.first_failed: FailedTrial | None = None  # the lowest-numbered, for the last line

    def count(
        self, number: int, job_num: int, job_return: JobReturn, outcome: TrialOutcome
    ) -> None:
        """Trial ``number`` (of job ``job_num``) was told ``outcome``."""
        self.told += 1
        self.pruned += outcome.state is TrialState.PRUNED
        complete = outcome.state is TrialState.COMPLETE
        self._note_best(number, outcome.values if complete else None)
        if not outcome.failed:
            shown = outcome.values if outcome.values is not None else "no value"
            log.info("furcate_optuna: trial %d %s: %s", number, outcome.state.name, shown)
            return
        assert outcome.error is not None
        self.failed += 1
        self.first_error = self.first_error or outcome.error
        if self.first_failed is None or number < self.first_failed.number:
            self.first_failed = FailedTrial.of(number, job_num, job_return, outcome.error)
        log.warning("furcate_optuna: trial %d failed: %s", number, outcome.error)

    def too_many_failures(self, concurrency: int) -> bool:
        """hydra-optuna-sweeper's max_failure_rate, judged per trial: at 0 the first failure
        stops the sweep; above 0 once a slot-full of trials has been told."""
        if not self.failed:
            return False
        rate = self.max_failure_rate
        if rate == 0:
            return True
        return self.told >= concurrency and self.failed / self.told > rate

    def _note_best(self, number: int, values: Sequence[float] | None) -> None:
        # one objective: the best value so far; several: Optuna's Pareto front has no one best
        if values is None or len(self.directions) != 1:
            return
        value = float(values[0])
        better = self._best_value is None or (
            value < self._best_value
            if self.directions[0] == "minimize"
            else value > self._best_value
        )
        if better:
            self._best_value = value
            self.best = f"{value:.6g} (trial {number})"
