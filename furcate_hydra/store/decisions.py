"""What to do with a config, given its recorded runs: skip it, resume a run, start one, or leave
it to the launcher that runs it right now."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.code_version import CodeChange
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags

__all__ = ["Action", "CodeCheck", "Decision", "Rerun", "decide"]


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
    ELSEWHERE = "elsewhere"  # RUNNING under a live launcher: wait for its outcome


@dataclass(frozen=True)
class Decision:
    action: Action
    record: RunRecord | None = None
    reason: str = ""
    other_code: bool = False  # SKIP of a run that other code finished (code_change=warn)
    # SKIP / REPORT_FAILURE of the outcome of a run another launcher held while this one waited
    ran_elsewhere: bool = False


@dataclass(frozen=True)
class CodeCheck:
    """The code this sweep runs (its ``CodeVersion.key``; None: unknown) and what a FINISHED
    run recorded by other code means."""

    key: str | None
    change: CodeChange

    def same(self, record: RunRecord) -> bool:
        # a run without a version (recorded before versions were) counts as other code
        return self.key is None or record.tags.get(Tags.CODE_VERSION) == self.key


def decide(
    records: Sequence[RunRecord],
    rerun: Rerun,
    gone: Callable[[RunRecord], str | None],
    code: CodeCheck | None = None,
) -> Decision:
    """Decide from a config's runs (newest first).

    ``gone(record)`` says why a RUNNING run's launcher is gone (None if it may be alive).
    A RUNNING run under a live launcher is that launcher's: the config is left to it, whatever
    ``rerun`` says (a config runs once however many launchers sweep it). A RUNNING run whose
    launcher is gone was interrupted; it and a KILLED run continue in the same run from their
    last checkpoint. A FAILED run is not resumed: its checkpoint may be what made it fail. With
    ``code`` and ``code_change=rerun``, a run other code FINISHED does not count: the config
    runs again, in a new run.
    """
    code = code or CodeCheck(None, CodeChange.IGNORE)
    stale: list[RunRecord] = []
    if code.change is CodeChange.RERUN:
        stale = [r for r in records if r.status is RunStatus.FINISHED and not code.same(r)]
        records = [r for r in records if r not in stale]
    if rerun is not Rerun.ALL:
        for record in records:
            if record.status is RunStatus.FINISHED:
                other = code.change is CodeChange.WARN and not code.same(record)
                return Decision(Action.SKIP, record, "already finished", other_code=other)
    # asked once per RUNNING run (cheap: the heartbeats are read already)
    why_gone = {r.run_id: gone(r) for r in records if r.status is RunStatus.RUNNING}
    live = [r for r in records if r.run_id in why_gone and why_gone[r.run_id] is None]
    if live:
        return Decision(Action.ELSEWHERE, live[0], "running in another launcher")
    if rerun is Rerun.ALL or not records:
        if stale:
            return Decision(Action.RUN, stale[0], "finished by other code")
        return Decision(Action.RUN)
    for record in records:
        if why_gone.get(record.run_id):
            return Decision(Action.RESUME, record, f"interrupted: {why_gone[record.run_id]}")
    newest = records[0]
    if newest.status is RunStatus.KILLED:
        if rerun is Rerun.NONE:
            return Decision(Action.REPORT_FAILURE, newest, "recorded as KILLED")
        return Decision(Action.RESUME, newest, "stopped before it finished")
    if newest.status is RunStatus.FAILED:
        if rerun is Rerun.NONE:
            return Decision(Action.REPORT_FAILURE, newest, "recorded as FAILED")
        return Decision(Action.RUN, newest, "failed before")
    return Decision(Action.RUN, newest, "not a run furcate ended")
