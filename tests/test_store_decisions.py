"""Skip, resume or run: the decision for one config from its recorded runs (newest first)."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store import Action, Rerun, RunRecord, RunStatus, decide

FINISHED, FAILED, KILLED, RUNNING = (
    RunStatus.FINISHED,
    RunStatus.FAILED,
    RunStatus.KILLED,
    RunStatus.RUNNING,
)
GONE_PREFIX = "gone-"


def records(*statuses: RunStatus, orphaned: Collection[int] = ()) -> list[RunRecord]:
    """Runs of one config, newest first, named by status and position (``killed-1``) so a case
    can say which run it expects; those at an index in ``orphaned`` lost their launcher."""
    return [
        RunRecord(
            run_id=f"{GONE_PREFIX if i in orphaned else ''}{status.value.lower()}-{i}",
            fingerprint="fp",
            status=status,
            start_time_ms=1000 - i,
            tags={},
        )
        for i, status in enumerate(statuses)
    ]


def gone(record: RunRecord) -> str | None:
    return "its launcher has exited" if record.run_id.startswith(GONE_PREFIX) else None


CASES: list[tuple[str, list[RunRecord], Rerun, Action, str | None]] = [
    ("no records", [], Rerun.FAILED, Action.RUN, None),
    ("no records, rerun=none", [], Rerun.NONE, Action.RUN, None),
    ("finished", records(FINISHED), Rerun.FAILED, Action.SKIP, "finished-0"),
    ("finished, rerun=none", records(FINISHED), Rerun.NONE, Action.SKIP, "finished-0"),
    # A FINISHED run anywhere wins over newer failures; the newest FINISHED one is used.
    (
        "finished behind failures",
        records(FAILED, KILLED, FINISHED, FINISHED),
        Rerun.FAILED,
        Action.SKIP,
        "finished-2",
    ),
    ("rerun=all ignores finished", records(FINISHED), Rerun.ALL, Action.RUN, None),
    ("rerun=all ignores killed", records(KILLED), Rerun.ALL, Action.RUN, None),
    (
        "interrupted",
        records(RUNNING, orphaned={0}),
        Rerun.FAILED,
        Action.RESUME,
        "gone-running-0",
    ),
    (
        "interrupted behind a newer failure",
        records(FAILED, RUNNING, orphaned={1}),
        Rerun.FAILED,
        Action.RESUME,
        "gone-running-1",
    ),
    (
        "interrupted, rerun=none",
        records(RUNNING, orphaned={0}),
        Rerun.NONE,
        Action.RESUME,
        "gone-running-0",
    ),
    # A config another launcher runs right now is left to it, whatever rerun says.
    ("running in a live launcher", records(RUNNING), Rerun.FAILED, Action.ELSEWHERE, "running-0"),
    ("running live, rerun=all", records(RUNNING), Rerun.ALL, Action.ELSEWHERE, "running-0"),
    ("running live, rerun=none", records(RUNNING), Rerun.NONE, Action.ELSEWHERE, "running-0"),
    (
        "running live beside an interrupted run",
        records(RUNNING, RUNNING, orphaned={0}),
        Rerun.FAILED,
        Action.ELSEWHERE,
        "running-1",
    ),
    (
        "finished wins over running live",
        records(RUNNING, FINISHED),
        Rerun.FAILED,
        Action.SKIP,
        "finished-1",
    ),
    ("rerun=all, interrupted", records(RUNNING, orphaned={0}), Rerun.ALL, Action.RUN, None),
    ("killed", records(KILLED, FAILED), Rerun.FAILED, Action.RESUME, "killed-0"),
    ("killed, rerun=none", records(KILLED), Rerun.NONE, Action.REPORT_FAILURE, "killed-0"),
    ("failed", records(FAILED, KILLED), Rerun.FAILED, Action.RUN, "failed-0"),
    ("failed, rerun=none", records(FAILED), Rerun.NONE, Action.REPORT_FAILURE, "failed-0"),
]


@pytest.mark.parametrize(
    ("runs", "rerun", "action", "run_id"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decide(runs: list[RunRecord], rerun: Rerun, action: Action, run_id: str | None) -> None:
    decision = decide(runs, rerun, gone)
    assert decision.action is action
    assert (decision.record.run_id if decision.record else None) == run_id


def test_decisions_say_why() -> None:
    assert decide(records(FINISHED), Rerun.FAILED, gone).reason == "already finished"
    resumed = decide(records(RUNNING, orphaned={0}), Rerun.FAILED, gone)
    assert resumed.reason == "interrupted: its launcher has exited"
    assert decide(records(KILLED), Rerun.NONE, gone).reason == "recorded as KILLED"
    assert decide(records(FAILED), Rerun.NONE, gone).reason == "recorded as FAILED"
    assert decide(records(RUNNING), Rerun.FAILED, gone).reason == "running in another launcher"


def test_gone_is_asked_only_about_running_runs() -> None:
    asked: list[str] = []

    def spy(record: RunRecord) -> str | None:
        asked.append(record.run_id)
        return None

    decide(records(FAILED, RUNNING, KILLED, RUNNING), Rerun.FAILED, spy)
    assert asked == ["running-1", "running-3"]
    asked.clear()
    decide(records(RUNNING, FINISHED), Rerun.FAILED, spy)  # finished: nothing to ask
    assert asked == []


@pytest.mark.parametrize("text", ["failed", "all", "none"])
def test_rerun_parse(text: str) -> None:
    assert Rerun.parse(text).value == text


@pytest.mark.parametrize("bad", ["FAILED", "always", "", None, 1, True])
def test_rerun_parse_names_the_key_and_the_choices(bad: object) -> None:
    with pytest.raises(FurcateConfigError) as error:
        Rerun.parse(bad)
    assert error.value.key == "hydra.launcher.rerun"
    message = str(error.value)
    assert f"hydra.launcher.rerun={bad!r}" in message
    assert "failed, all, none" in message and "Fix:" in message
