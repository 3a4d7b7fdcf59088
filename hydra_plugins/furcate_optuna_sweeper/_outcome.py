"""A trial's job return, read as what Optuna is told: values, PRUNED, or FAIL with a reason."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from optuna.trial import TrialState

from furcate_hydra.hydra_api.private_names import returned

__all__ = ["TrialOutcome", "TrialValueError", "read_outcome"]


class TrialValueError(CompactHydraException, ValueError):
    """A job returned something that is not one number per direction of the study."""


@dataclass(frozen=True)
class TrialOutcome:
    state: TrialState
    values: list[float] | None
    error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.state is TrialState.FAIL


def read_outcome(
    job_return: JobReturn, directions: Sequence[str], label: str, pruned: bool
) -> TrialOutcome:
    """COMPLETE with one float per direction, PRUNED (the job's callback stopped it), or FAIL."""
    if job_return.status is not JobStatus.COMPLETED:
        error = returned(job_return)
        if not isinstance(error, BaseException):
            error = RuntimeError(f"{label} failed: {error}")
        return TrialOutcome(TrialState.FAIL, None, error)
    try:
        values = _values(job_return.return_value, directions, label)
    except TrialValueError as exc:
        if pruned:  # stopped early: no final value is needed
            return TrialOutcome(TrialState.PRUNED, None)
        return TrialOutcome(TrialState.FAIL, None, exc)
    if pruned:
        return TrialOutcome(TrialState.PRUNED, values)
    if any(math.isnan(v) for v in values):
        return TrialOutcome(
            TrialState.FAIL, None, TrialValueError(f"{label} returned NaN ({values})")
        )
    return TrialOutcome(TrialState.COMPLETE, values)


def _values(value: Any, directions: Sequence[str], label: str) -> list[float]:
    wanted = len(directions)
    items = list(value) if isinstance(value, list | tuple) else [value]
    fix = (
        f"return a number (the value to {directions[0]})"
        if wanted == 1
        else f"return a tuple of {wanted} numbers, one per direction"
    )
    if len(items) != wanted:
        raise TrialValueError(
            f"{label} returned {value!r} ({_count(len(items))}), but hydra.sweeper.direction "
            f"is {list(directions)} ({_count(wanted)}). Fix: {fix}, or set "
            "hydra.sweeper.direction to one direction per value the task returns."
        )
    try:
        return [float(v) for v in items]
    except (TypeError, ValueError):
        raise TrialValueError(
            f"{label} returned {value!r}, which is not {'a number' if wanted == 1 else 'numbers'}"
            f". Fix: {fix}."
        ) from None


def _count(n: int) -> str:
    return "1 value" if n == 1 else f"{n} values"
