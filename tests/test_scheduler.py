"""The scheduler, without Hydra: a fake ledger decides, a fake executor runs, results are text.

Every rule of what runs when is here: a skip and a reported failure never reach the executor,
a config held elsewhere is followed until it ended there or was let go, fail_fast cancels the
queue and starts nothing more, counts belong to one stream, and every job comes back once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from furcate_hydra.execution.executor import JobListener
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.layout import JobPaths
from furcate_hydra.scheduling import Scheduler, StreamCounts, scheduler
from furcate_hydra.store import Action, Decision, RunRecord, RunStatus

RUN = Decision(Action.RUN)


class FakeExecutor:
    """Holds submitted jobs; each ``wait_any`` ends the oldest (FAILED if its key is in
    ``fails``), and hands back any cancelled ones first."""

    slot_count = 2
    idle_slots = 2

    def __init__(self, fails: Iterable[str] = ()) -> None:
        self.fails = set(fails)
        self.held: dict[str, Job] = {}
        self.ended: list[Job] = []
        self.submitted: list[str] = []
        self.cancelled: list[str] = []

    @property
    def pending(self) -> int:
        return len(self.held) + len(self.ended)

    def describe(self) -> str:
        return "fake"

    def start(self) -> None:
        """Nothing starts: a job ends when it is waited for."""

    def wait_ready(self) -> None:
        """Always ready."""

    def set_context(self, context: bytes) -> None:
        """No process is started from it."""

    def submit(self, job: Job) -> None:
        self.held[job.key] = job
        self.submitted.append(job.key)

    def wait_any(self, timeout: float | None = None) -> list[Job]:
        out, self.ended = self.ended, []
        if not out and self.held:
            job = self.held.pop(next(iter(self.held)))
            job.state = JobState.FAILED if job.key in self.fails else JobState.COMPLETED
            out = [job]
        return out

    def cancel(self, keys: Iterable[str]) -> None:
        for key in keys:
            job = self.held.pop(key)
            job.state = JobState.CANCELLED
            self.cancelled.append(key)
            self.ended.append(job)

    def preload(self, modules: Sequence[str]) -> None:
        pass  # nothing is forked here

    @property
    def learned_imports(self) -> tuple[str, ...]:
        return ()

    def add_listener(self, listener: JobListener) -> None:
        pass

    def close(self) -> None:
        pass


class FakeLedger:
    """Decides each job by its key (RUN unless told); ``claims``: a claim's answer instead;
    ``follows``: per run id, the answers of successive follows (None: still running)."""

    decides_without_store = True

    def __init__(self, decisions: dict[str, Decision] | None = None) -> None:
        self.decisions = decisions or {}
        self.claims: dict[str, Decision] = {}
        self.follows: dict[str, list[Decision | None]] = {}
        self.opened: list[str] = []

    def prepare(self, jobs: Sequence[Job]) -> list[Decision] | None:
        return self.decide(jobs)

    def decide(self, jobs: Sequence[Job]) -> list[Decision] | None:
        return [self.decisions.get(job.key, RUN) for job in jobs]

    def needs_store(self, decisions: Sequence[Decision]) -> bool:
        return False

    def claim(self, jobs: Sequence[Job], decisions: Sequence[Decision]) -> list[Decision]:
        return [self.claims.pop(job.key, d) for job, d in zip(jobs, decisions, strict=True)]

    def open(self, job: Job, decision: Decision) -> str | None:
        if decision.action is Action.SKIP:
            return f"skipped {job.key}"
        if decision.action is Action.REPORT_FAILURE:
            return f"reported {job.key}"
        self.opened.append(job.key)
        return None

    def follow(self, waiting: Sequence[RunRecord]) -> list[Decision | None]:
        return [self.follows[run.run_id].pop(0) for run in waiting]

    def holder(self, record: RunRecord) -> str:
        return "another launcher"

    def flush(self, force: bool = True) -> None:
        pass


class FakeHandler:
    """Results as text; a job that did not complete is told to the scheduler as failed."""

    def __init__(self) -> None:
        self.scheduler: Scheduler[str] | None = None
        self.warm_ups = 0
        self.not_run_keys: list[str] = []

    def warm_up(self) -> bool:
        self.warm_ups += 1
        return self.warm_ups == 1

    def start_view(self) -> None:
        pass

    def submitting(self, job: Job) -> None:
        pass

    def not_run(self, job: Job, result: str) -> None:
        self.not_run_keys.append(job.key)

    def finished(self, job: Job) -> str:
        if job.state is not JobState.COMPLETED and job.state is not JobState.CANCELLED:
            assert self.scheduler is not None
            self.scheduler.failed(job, "failed")
        return job.state.value

    def not_started(self, job: Job) -> str:
        return "not started"


def make(
    ledger: FakeLedger, executor: FakeExecutor | None = None, fail_fast: bool = False
) -> tuple[Scheduler[str], FakeExecutor, FakeHandler]:
    executor = executor or FakeExecutor()
    handler = FakeHandler()
    handler.scheduler = Scheduler(executor, ledger, handler, fail_fast)
    return handler.scheduler, executor, handler


def jobs(*keys: str) -> list[Job]:
    return [
        Job(key, int(key), (), f"job {key}", JobPaths.of(Path("/tmp/never") / key)) for key in keys
    ]


def drain(sched: Scheduler[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    while batch := sched.wait_any(timeout=5):
        out += batch
    return out


def record(run_id: str) -> RunRecord:
    return RunRecord(run_id, "fp", RunStatus.RUNNING, 0, {})


@pytest.fixture(autouse=True)
def quick_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "ELSEWHERE_POLL_S", 0.01)


def test_a_skipped_job_never_reaches_the_executor_nor_warms_up() -> None:
    sched, executor, handler = make(FakeLedger({"0": Decision(Action.SKIP, record("r0"))}))
    sched.submit(jobs("0"))
    assert drain(sched) == [("0", "skipped 0")]
    assert executor.submitted == [] and handler.warm_ups == 0
    assert sched.counts == StreamCounts(submitted=1, skipped=1)


def test_a_recorded_failure_is_reported_not_run() -> None:
    failed = Decision(Action.REPORT_FAILURE, record("r0"), "FAILED")
    sched, executor, handler = make(FakeLedger({"0": failed}))
    sched.submit(jobs("0", "1"))
    assert sorted(drain(sched)) == [("0", "reported 0"), ("1", "completed")]
    assert executor.submitted == ["1"] and handler.not_run_keys == ["0"]
    assert sched.counts == StreamCounts(submitted=2, skipped=1)


def test_a_config_held_elsewhere_comes_back_once_it_ended_there() -> None:
    ledger = FakeLedger()
    ledger.claims["0"] = Decision(Action.ELSEWHERE, record("theirs"))
    ended = Decision(Action.SKIP, record("theirs"), "ran elsewhere", ran_elsewhere=True)
    ledger.follows["theirs"] = [None, ended]
    sched, executor, _ = make(ledger)
    sched.submit(jobs("0"))
    assert sched.held_elsewhere("0") == record("theirs")
    assert drain(sched) == [("0", "skipped 0")]
    assert executor.submitted == [] and sched.held_elsewhere("0") is None
    assert sched.counts == StreamCounts(submitted=1, ran_elsewhere=1)


def test_a_config_let_go_elsewhere_is_claimed_and_run_here() -> None:
    ledger = FakeLedger()
    ledger.claims["0"] = Decision(Action.ELSEWHERE, record("theirs"))
    ledger.follows["theirs"] = [Decision(Action.RESUME, record("theirs"), "launcher gone")]
    sched, executor, _ = make(ledger)
    sched.submit(jobs("0"))
    assert drain(sched) == [("0", "completed")]
    assert executor.submitted == ["0"] and ledger.opened == ["0"]


def test_fail_fast_cancels_the_queue_and_starts_nothing_more() -> None:
    sched, executor, _ = make(FakeLedger(), FakeExecutor(fails={"0"}), fail_fast=True)
    sched.submit(jobs("0", "1", "2"))
    assert sched.wait_any() == [("0", "failed")]
    assert executor.cancelled == ["1", "2"]
    assert sched.stopped_by == "hydra.launcher.fail_fast after job #0 failed"
    sched.submit(jobs("3"))
    assert sorted(drain(sched)) == [("1", "cancelled"), ("2", "cancelled"), ("3", "not started")]
    assert executor.submitted == ["0", "1", "2"] and sched.counts.submitted == 4


def test_without_fail_fast_a_failure_stops_nothing() -> None:
    sched, executor, _ = make(FakeLedger(), FakeExecutor(fails={"0"}))
    sched.submit(jobs("0", "1"))
    assert drain(sched) == [("0", "failed"), ("1", "completed")]
    assert executor.cancelled == [] and sched.stopped_by is None


def test_counts_belong_to_one_stream() -> None:
    sched, _, _ = make(FakeLedger({"0": Decision(Action.SKIP, record("r0"))}))
    first = sched.new_stream()
    sched.submit(jobs("0", "1"))
    drain(sched)
    second = sched.new_stream()
    sched.submit(jobs("2"))
    drain(sched)
    assert first == StreamCounts(submitted=2, skipped=1)
    assert second == StreamCounts(submitted=1) and sched.counts is second


def test_every_job_is_handed_back_once() -> None:
    ledger = FakeLedger(
        {
            "0": Decision(Action.SKIP, record("r0")),
            "1": Decision(Action.REPORT_FAILURE, record("r1"), "FAILED"),
        }
    )
    ledger.claims["2"] = Decision(Action.ELSEWHERE, record("theirs"))
    ledger.follows["theirs"] = [None, Decision(Action.RUN)]
    sched, _, _ = make(ledger)
    sched.submit(jobs("0", "1", "2", "3", "4"))
    keys = [key for key, _ in drain(sched)]
    assert sorted(keys) == ["0", "1", "2", "3", "4"]
    assert sched.in_flight == [] and sched.wait_any(timeout=0) == []


def test_give_up_forgets_the_jobs_in_flight_and_followed() -> None:
    ledger = FakeLedger()
    ledger.claims["1"] = Decision(Action.ELSEWHERE, record("theirs"))
    sched, _, _ = make(ledger)
    sched.submit(jobs("0", "1"))
    assert [job.key for job in sched.give_up()] == ["0"]
    assert sched.held_elsewhere("1") is None and sched.in_flight == []
