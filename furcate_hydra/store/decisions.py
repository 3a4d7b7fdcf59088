"""What to do with a config, given its recorded runs: skip it, resume a run, or start one."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.records import RunRecord, RunStatus

__all__ = ["Action", "Decision", "Rerun", "decide"]


class Rerun(enum.Enum):
    """Which recorded configs run again (``hydra.launcher.rerun``)."""

    FAILED = "failed"  # FAILED and KILLED ones run again; FINISHED ones are skipped
    ALL = "all"  # ignore the record: every config runs, in a new run
    NONE = "none"  # nothing recorded runs again; FAILED/KILLED ones report their failure

    @classmethod
    def parse(cls, value: object) -> Rerun:
        for member in cls:
            if value == member.value:
                return member
        raise FurcateConfigError(
            "hydra.launcher.rerun",
            value,
            "must be one of failed, all, none",
            "set hydra.launcher.rerun=failed (re-run FAILED and KILLED configs, skip FINISHED "
            "ones), all (run everything again) or none (run only configs never recorded)",
        )


class Action(enum.Enum):
    RUN = "run"  # a new run, from scratch
    RESUME = "resume"  # the same run again, from its last checkpoint
    SKIP = "skip"  # FINISHED: return the recorded value
    REPORT_FAILURE = "report_failure"  # rerun=none and the record says FAILED/KILLED


@dataclass(frozen=True)
class Decision:
    action: Action
    record: RunRecord | None = None
    reason: str = ""


def decide(
    records: Sequence[RunRecord], rerun: Rerun, gone: Callable[[RunRecord], str | None]
) -> Decision:
    """Decide from a config's runs (newest first).

    ``gone(record)`` says why a RUNNING run's launcher is gone (None if it may be alive).
    A RUNNING run whose launcher is gone was interrupted; it and a KILLED run continue in the
    same run from their last checkpoint. A FAILED run is not resumed: its checkpoint may be
    what made it fail.
    """
    if rerun is Rerun.ALL or not records:
        return Decision(Action.RUN)
    for record in records:
        if record.status is RunStatus.FINISHED:
            return Decision(Action.SKIP, record, "already finished")
    for record in records:
        if record.status is RunStatus.RUNNING:
            why = gone(record)
            if why is not None:
                return Decision(Action.RESUME, record, f"interrupted: {why}")
    newest = records[0]
    if newest.status is RunStatus.KILLED:
        if rerun is Rerun.NONE:
            return Decision(Action.REPORT_FAILURE, newest, "recorded as KILLED")
        return Decision(Action.RESUME, newest, "stopped before it finished")
    if newest.status is RunStatus.FAILED:
        if rerun is Rerun.NONE:
            return Decision(Action.REPORT_FAILURE, newest, "recorded as FAILED")
        return Decision(Action.RUN, newest, "failed before")
    # RUNNING under a live launcher (another sweep runs this config right now).
    return Decision(Action.RUN, newest, "is running in another launcher")
