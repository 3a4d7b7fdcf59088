"""The job lifecycle every backend shares (``JobPool``), driven through a fake transport.

The fake runs each placed job on a thread of its own that plays a script (complete, raise,
crash, preempt, hang until stopped, ...) and reports through a queue, as a fork server or a
Ray actor would; no process is started. Every rule here holds for the local and the Ray pool
alike, since both are this pool over their transport.
"""

from __future__ import annotations

import queue
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from furcate_hydra import env_vars, job_secrets
from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution.executor import EventKind, Executor, JobEvent
from furcate_hydra.execution.forkserver.protocol import ChildReport
from furcate_hydra.execution.job import Job, JobState
from furcate_hydra.execution.job_pool import JobPool
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.slots import Slot
from furcate_hydra.execution.transport import (
    Broken,
    Ended,
    Placed,
    Report,
    Started,
    Transport,
    TransportBroken,
)
from furcate_hydra.layout import JobPaths
from furcate_hydra.progress import write_progress

KILLED = signal.SIGKILL  # a wait status: killed by SIGKILL
TERMINATED = signal.SIGTERM  # a wait status: killed by SIGTERM (a preemption from outside)


class FakeTransport(Transport):
    """Slots on threads. ``scripts[key]``: what each attempt of a job does, in order (the last
    one repeats): "ok", "raise", "crash", "sigterm", "preempt", "died", "start_error", "hang"
    (until stopped), "report_preempted_when_stopped" (hangs; stopped, it says preempted)."""

    name = "fake slot pool"

    def __init__(self, slots: int, scripts: dict[str, list[str]] | None = None) -> None:
        self.slots = [Slot(i, None, None, None) for i in range(slots)]
        self.scripts = scripts or {}
        self.free = list(self.slots)
        self.held: dict[str, Slot] = {}
        self.stops: dict[str, threading.Event] = {}
        self.reports: queue.Queue[Report] = queue.Queue()
        self.placed: list[tuple[str, int]] = []  # (key, attempt), in order
        self.breaks: str | None = None  # set: the next poll raises TransportBroken
        self.place_breaks = False
        self.abandoned = self.closed = False

    @property
    def slot_count(self) -> int:
        return len(self.slots)

    @property
    def idle_slots(self) -> int:
        return len(self.free)

    def describe(self) -> str:
        return f"{len(self.slots)} fake slots"

    def start(self) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def set_context(self, context: bytes) -> None:
        pass

    def has_room(self) -> bool:
        return bool(self.free)

    def place(self, job: Job) -> Placed:
        if self.place_breaks:
            raise TransportBroken("the fake machinery refused a job")
        slot = self.free.pop(0)
        self.held[job.key] = slot
        self.placed.append((job.key, job.attempts))
        script = self.scripts.get(job.key, ["ok"])
        action = script[min(job.attempts, len(script)) - 1]
        stop = self.stops[job.key] = threading.Event()
        threading.Thread(target=self._run, args=(job.key, job.attempts, action, stop)).start()
        return Placed(slot)

    def stop(self, job: Job) -> None:
        self.stops[job.key].set()

    def poll(self, timeout: float) -> list[Report]:
        if self.breaks is not None:
            raise TransportBroken(self.breaks)
        try:
            reports = [self.reports.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self.reports.empty():
            reports.append(self.reports.get_nowait())
        for report in reports:  # on the owner's thread, as the contract says
            if isinstance(report, Ended) and report.key in self.held:
                self.free.append(self.held.pop(report.key))
        return reports

    def abandon(self) -> None:
        self.abandoned = True
        for stop in self.stops.values():
            stop.set()
        self.held.clear()
        self.free.clear()

    def close(self) -> None:
        self.closed = True
        for stop in self.stops.values():
            stop.set()

    def _run(self, key: str, attempt: int, action: str, stop: threading.Event) -> None:
        put = self.reports.put
        if action == "start_error":
            put(Ended(key, start_error="cannot open the job's log files"))
            return
        put(Started(key, pid=1000 + attempt, started_at=time.time()))
        if action in ("hang", "report_preempted_when_stopped"):
            stop.wait(30)
            said = "preempted by SIGTERM" if action != "hang" else None
            put(Ended(key, ChildReport(preempted=said) if said else None, TERMINATED))
        elif action == "ok":
            put(Ended(key, ChildReport(value=f"{key}:{attempt}"), 0, time.time()))
        elif action == "raise":
            put(Ended(key, ChildReport(error="Traceback ...\nValueError: bad lr"), 256))
        elif action == "crash":
            put(Ended(key, None, KILLED, where="node 10.0.0.5"))
        elif action == "sigterm":
            put(Ended(key, None, TERMINATED))
        elif action == "preempt":
            put(Ended(key, ChildReport(preempted="preempted by SIGUSR1 (saved)"), 75 << 8))
        elif action == "died":
            put(Ended(key, died="the Ray worker of slot 0 died while running the job"))


def job(tmp_path: Path, key: str) -> Job:
    return Job(key, int(key), (), f"i={key}", JobPaths.of(tmp_path / key))


def options(max_retries: int = 0, max_preemptions: int = 3) -> PoolOptions:
    return PoolOptions(max_retries, max_preemptions, None, False, 1.0)


@pytest.fixture
def events() -> list[JobEvent]:
    return []


def pool_of(transport: FakeTransport, events: list[JobEvent], **kw: int) -> Iterator[JobPool]:
    pool = JobPool(transport, options(**kw))
    pool.add_listener(events.append)
    with pool:
        yield pool


def kinds(events: list[JobEvent], key: str) -> list[str]:
    return [e.kind.value for e in events if e.job.key == key and e.kind is not EventKind.PROGRESS]


def test_the_pool_is_an_executor_and_hands_every_job_back_once(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    transport = FakeTransport(2)
    for pool in pool_of(transport, events):
        assert isinstance(pool, Executor)
        assert (pool.slot_count, pool.idle_slots, pool.describe()) == (2, 2, "2 fake slots")
        jobs = [job(tmp_path, str(i)) for i in range(5)]
        done = pool.run_all(jobs)
        assert [j.key for j in done] == ["0", "1", "2", "3", "4"]
        assert all(j.state is JobState.COMPLETED and j.attempts == 1 for j in done)
        assert [j.value for j in done] == [f"{i}:1" for i in range(5)]
        assert pool.pending == 0 and pool.idle_slots == 2
        assert all(kinds(events, str(i)) == ["started", "ended"] for i in range(5))
        assert all(j.started_at is not None and j.ended_at is not None for j in done)
        assert all(j.paths.output_dir.is_dir() for j in done)
    assert transport.closed


def test_a_crashed_job_is_retried_up_to_max_retries(tmp_path: Path, events: list[JobEvent]) -> None:
    transport = FakeTransport(1, {"0": ["crash", "crash", "ok"], "1": ["crash"]})
    for pool in pool_of(transport, events, max_retries=2):
        survivor, crasher = pool.run_all([job(tmp_path, "0"), job(tmp_path, "1")])
    assert (survivor.state, survivor.attempts, survivor.value) == (JobState.COMPLETED, 3, "0:3")
    assert kinds(events, "0") == ["started", "retrying"] * 2 + ["started", "ended"]
    retry = next(e for e in events if e.kind is EventKind.RETRYING)
    assert "killed by SIGKILL" in retry.detail and "(on node 10.0.0.5)" in retry.detail
    assert (crasher.state, crasher.attempts) == (JobState.CRASHED, 3)
    assert crasher.error is not None
    assert crasher.error.startswith("the job's process was killed by SIGKILL")
    assert crasher.error.endswith(crasher.paths.see_logs())
    # a retry goes first: #0's three attempts all ran before #1's first
    assert transport.placed[:4] == [("0", 1), ("0", 2), ("0", 3), ("1", 1)]


def test_a_job_that_raised_or_could_not_start_is_not_retried(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    transport = FakeTransport(2, {"0": ["raise"], "1": ["start_error"]})
    for pool in pool_of(transport, events, max_retries=3):
        raised, unstarted = pool.run_all([job(tmp_path, "0"), job(tmp_path, "1")])
    assert (raised.state, raised.attempts) == (JobState.FAILED, 1)
    assert raised.error == f"Traceback ...\nValueError: bad lr\n{raised.paths.see_logs()}"
    assert (unstarted.state, unstarted.attempts) == (JobState.FAILED, 1)
    assert unstarted.error == "cannot open the job's log files"
    assert kinds(events, "1") == ["ended"]  # it never started


def test_a_dead_slot_under_a_job_is_a_crash_with_its_reason(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    transport = FakeTransport(1, {"0": ["died", "ok"], "1": ["died"]})
    for pool in pool_of(transport, events, max_retries=1):
        retried, crashed = pool.run_all([job(tmp_path, "0"), job(tmp_path, "1")])
    assert (retried.state, retried.attempts) == (JobState.COMPLETED, 2)
    assert (crashed.state, crashed.attempts) == (JobState.CRASHED, 2)
    assert crashed.error is not None and crashed.error.startswith("the Ray worker of slot 0")


@pytest.mark.parametrize(
    ("script", "said"),
    [("preempt", "preempted by SIGUSR1 (saved)"), ("sigterm", "preempted by SIGTERM")],
)
def test_a_preempted_job_goes_first_in_the_queue_without_using_a_retry(
    tmp_path: Path, events: list[JobEvent], script: str, said: str
) -> None:
    transport = FakeTransport(1, {"0": [script, script, "ok"]})
    for pool in pool_of(transport, events, max_retries=0, max_preemptions=2):
        first, *_ = pool.run_all([job(tmp_path, str(i)) for i in range(3)])
    assert (first.state, first.attempts, first.preemptions) == (JobState.COMPLETED, 3, 2)
    assert kinds(events, "0") == ["started", "preempted"] * 2 + ["started", "ended"]
    assert all(said in e.detail for e in events if e.kind is EventKind.PREEMPTED)
    assert [key for key, _ in transport.placed] == ["0", "0", "0", "1", "2"]


def test_a_job_preempted_more_often_than_allowed_ends_preempted(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    transport = FakeTransport(1, {"0": ["preempt"]})
    for pool in pool_of(transport, events, max_preemptions=1):
        (done,) = pool.run_all([job(tmp_path, "0")])
    assert (done.state, done.attempts, done.preemptions) == (JobState.PREEMPTED, 2, 2)
    assert done.error is not None
    assert "preempted 2 times, more than hydra.launcher.max_preemptions=1 allows" in done.error
    assert "run the same command to resume it" in done.error


def test_cancelled_jobs_come_back_cancelled_queued_or_running(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    # the running one says "preempted" when stopped: the pool's own stop is no preemption
    transport = FakeTransport(1, {"0": ["report_preempted_when_stopped"]})
    for pool in pool_of(transport, events, max_retries=3):
        running, queued = job(tmp_path, "0"), job(tmp_path, "1")
        pool.submit(running)
        pool.submit(queued)
        assert pool.wait_any(timeout=0.5) == []  # started: nothing ended yet
        pool.cancel(["1", "0", "unknown"])
        done = []
        while pool.pending:
            done += pool.wait_any()
    assert {j.key: (j.state, j.error) for j in done} == {
        "0": (JobState.CANCELLED, "stopped by the launcher"),
        "1": (JobState.CANCELLED, "cancelled before it started"),
    }
    assert running.attempts == 1 and running.preemptions == 0
    assert kinds(events, "1") == ["ended"]
    assert transport.placed == [("0", 1)]


def test_a_broken_transport_loses_every_job_and_refuses_submits(
    tmp_path: Path, events: list[JobEvent]
) -> None:
    transport = FakeTransport(1, {"0": ["hang"]})
    for pool in pool_of(transport, events):
        pool.submit(job(tmp_path, "0"))
        pool.submit(job(tmp_path, "1"))
        assert pool.wait_any(timeout=0.3) == []
        transport.breaks = "the fork server died (exit code -9)"
        lost = pool.wait_any()
        assert {j.key: j.state for j in lost} == {"0": JobState.LOST, "1": JobState.LOST}
        assert all(j.error is not None and j.error.startswith(transport.breaks) for j in lost)
        assert transport.abandoned and pool.pending == 0
        with pytest.raises(ExecutorBrokenError, match=r"the fake slot pool is broken \(the fork"):
            pool.submit(job(tmp_path, "2"))


def test_a_job_that_crashes_once_the_transport_broke_is_lost_not_retried(
    tmp_path: Path,
) -> None:
    transport = FakeTransport(1, {"0": ["hang"]})
    with JobPool(transport, options(max_retries=3)) as pool:
        pool.submit(job(tmp_path, "0"))
        assert pool.wait_any(timeout=0.2) == []
        # the transport's death, then the job's crash, in one poll: no retry is placed
        transport.reports.put(Broken("no slot is left"))
        transport.reports.put(Ended("0", None, KILLED))
        (lost,) = pool.wait_any()
        assert (lost.state, lost.attempts) == (JobState.LOST, 1)
        assert lost.error is not None and lost.error.startswith("no slot is left")
        assert transport.placed == [("0", 1)]


def test_a_transport_that_breaks_placing_a_job_loses_it(tmp_path: Path) -> None:
    transport = FakeTransport(1)
    transport.place_breaks = True
    with JobPool(transport, options()) as pool:
        pool.submit(job(tmp_path, "0"))
        (lost,) = pool.wait_any()
        assert lost.state is JobState.LOST
        assert lost.error is not None and "refused a job" in lost.error


def test_a_key_already_queued_or_running_is_refused(tmp_path: Path) -> None:
    transport = FakeTransport(1, {"0": ["hang"], "1": ["hang"]})
    with JobPool(transport, options()) as pool:
        pool.submit(job(tmp_path, "0"))  # running
        pool.submit(job(tmp_path, "1"))  # queued
        for key in ("0", "1"):
            with pytest.raises(ValueError, match=f"job key '{key}' is already queued or running"):
                pool.submit(job(tmp_path, key))
        pool.cancel(["0", "1"])
        while pool.pending:
            pool.wait_any()


def test_progress_is_told_while_a_job_runs(tmp_path: Path, events: list[JobEvent]) -> None:
    transport = FakeTransport(1, {"0": ["hang"]})
    for pool in pool_of(transport, events):
        running = job(tmp_path, "0")
        pool.submit(running)
        pool.wait_any(timeout=0.2)
        write_progress(running.paths.progress, epoch=1, step=40, metrics={"loss": 0.5})
        deadline = time.monotonic() + 5
        while not any(e.kind is EventKind.PROGRESS for e in events):
            assert time.monotonic() < deadline, "no PROGRESS event"
            pool.wait_any(timeout=0.5)
        (told,) = [e for e in events if e.kind is EventKind.PROGRESS]
        assert told.progress is not None and told.progress.step == 40
        assert running.progress == told.progress
        pool.cancel(["0"])
        while pool.pending:
            pool.wait_any()


# -- fuse=auto: jobs start in groups ------------------------------------------------------


def fused_options(fuse_max: int) -> PoolOptions:
    return PoolOptions(0, 3, None, False, 1.0, fork_ahead=False, fuse_max=fuse_max)


def groups_placed(transport: FakeTransport, jobs: dict[str, Job]) -> list[list[str]]:
    """The keys of each fused group the pool started, in order (a job alone: no group)."""
    by_dir: dict[str, list[str]] = {}
    for key, _ in transport.placed:
        directory = jobs[key].env.get(env_vars.FUSE_DIR, f"alone-{key}")
        by_dir.setdefault(directory, []).append(key)
    return list(by_dir.values())


def test_jobs_submitted_together_start_in_even_groups_one_per_free_slot(tmp_path: Path) -> None:
    # 2 slots of 8 seats each; 6 jobs submitted, then waited for: a group of 3 on each slot
    transport = FakeTransport(16)
    jobs = {str(i): job(tmp_path, str(i)) for i in range(6)}
    with JobPool(transport, fused_options(8)) as pool:
        for item in jobs.values():
            pool.submit(item)
        assert transport.placed == []  # a group waits while jobs are still being submitted
        done = [j.key for j in pool.as_completed()]
        groups = groups_placed(transport, jobs)
        assert groups == [["0", "1", "2"], ["3", "4", "5"]]
        secrets = []
        for group in groups:
            envs = [jobs[key].env for key in group]
            assert {e[env_vars.FUSE_SIZE] for e in envs} == {"3"}
            assert [e[env_vars.FUSE_KEY] for e in envs] == group
            directory = Path(envs[0][env_vars.FUSE_DIR])
            # the group's own directory, only this user's, and its own secret, in no variable
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
            (secret,) = {jobs[key].secrets[job_secrets.FUSED_GROUP] for key in group}
            assert len(secret) == job_secrets.KEY_BYTES
            assert not any(secret.hex() in v or str(secret) in v for e in envs for v in e.values())
            secrets.append(secret)
            # every member's job ended: each is marked left, so no leader would wait for it
            assert sorted(p.name for p in directory.glob(f"{env_vars.FUSE_LEFT}*")) == [
                f"{env_vars.FUSE_LEFT}{key}" for key in group
            ]
    assert sorted(done, key=int) == list(jobs)
    assert not directory.exists()  # the pool's group dirs went with it
    assert secrets[0] != secrets[1]


def test_a_full_group_starts_while_jobs_are_still_submitted_and_a_lone_job_is_no_group(
    tmp_path: Path,
) -> None:
    transport = FakeTransport(4, {str(i): ["hang"] for i in range(4)})
    jobs = {str(i): job(tmp_path, str(i)) for i in range(5)}
    with JobPool(transport, fused_options(2)) as pool:
        for key in "012":
            pool.submit(jobs[key])
        assert transport.placed == []  # not yet a full group for each of the 2 free slots
        pool.submit(jobs["3"])
        assert [key for key, _ in transport.placed] == ["0", "1", "2", "3"]  # need not wait
        assert jobs["0"].env[env_vars.FUSE_DIR] == jobs["1"].env[env_vars.FUSE_DIR]
        assert jobs["2"].env[env_vars.FUSE_DIR] == jobs["3"].env[env_vars.FUSE_DIR]
        assert jobs["0"].env[env_vars.FUSE_DIR] != jobs["2"].env[env_vars.FUSE_DIR]
        pool.submit(jobs["4"])
        pool.cancel(["0", "1"])  # their slot frees: the caller waits, the last job starts, alone
        ended = pool.wait_any(timeout=5)
        while len(transport.placed) < 5 and ended:
            ended = pool.wait_any(timeout=5)
        assert [key for key, _ in transport.placed] == ["0", "1", "2", "3", "4"]
        assert env_vars.FUSE_DIR not in jobs["4"].env
        pool.cancel(["2", "3", "4"])
        list(pool.as_completed())


def test_a_groups_seats_are_taken_on_one_slot() -> None:
    from furcate_hydra.execution.fused_groups import seated
    from furcate_hydra.execution.slot_book import SlotBook
    from furcate_hydra.execution.slots import SlotPlan

    plan = seated(SlotPlan((Slot(0, None, (0,), 1), Slot(1, None, (1,), 1)), "cpu"), 3)
    assert [(s.index, s.home, s.cpus) for s in plan.slots] == [
        (0, 0, (0,)), (1, 0, (0,)), (2, 0, (0,)), (3, 1, (1,)), (4, 1, (1,)), (5, 1, (1,)),
    ]  # fmt: skip
    assert plan.describe() == (
        "2 CPU slots (no GPU), 1 pinned core each; fused groups of up to 3 jobs per slot"
    )
    book = SlotBook(plan.slots)
    first = book.take_free()
    assert [book.take_free(first.home).home for _ in range(2)] == [first.home] * 2
    second = book.take_free()  # a new group: the least busy slot
    assert second.home != first.home
