"""A config runs once however many launchers sweep it: claims, checked in a real sqlite store.

Two ``RunStore``s in this process stand for two launchers (the same pid counts as alive for
both); threads make their claims look at the same time. The races of real launcher processes
are in test_store_concurrent_launchers.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from furcate_hydra.store import (
    Action,
    Claim,
    ClaimRequest,
    Rerun,
    RunRecord,
    RunStatus,
    RunStore,
    Tags,
    resolve_tracking_uri,
)
from furcate_hydra.store.claims import WON, judge
from tests.store_helpers import exited_launcher


def record(run_id: str, start_ms: int, *, won: bool = False) -> RunRecord:
    tags = {Tags.CLAIM: WON} if won else {}
    return RunRecord(run_id, "fp", RunStatus.RUNNING, start_ms, tags)


# -- the rule, on records ---------------------------------------------------------------


def test_a_claim_with_no_rival_wins() -> None:
    assert judge(record("mine", 100), [], None).won


def test_a_won_rival_holds_the_config_even_if_it_started_later() -> None:
    verdict = judge(record("mine", 100), [record("late", 200, won=True)], None)
    assert verdict.holder is not None and verdict.holder.run_id == "late"
    # a winner's logged params say the same as the tag
    logged = replace(record("late", 200), params_logged=True)
    assert judge(record("mine", 100), [logged], None).holder == logged
    # ... also while waiting for other rivals to withdraw
    again = judge(record("mine", 100), [record("late", 200, won=True)], frozenset({"x"}))
    assert again.holder is not None and again.holder.run_id == "late"


def test_an_earlier_rival_wins_ties_go_to_the_smaller_run_id() -> None:
    lost = judge(record("mine", 200), [record("early", 100), record("later", 300)], None)
    assert lost.holder is not None and lost.holder.run_id == "early"
    tie = judge(record("b", 100), [record("a", 100)], None)
    assert tie.holder is not None and tie.holder.run_id == "a"
    assert not judge(record("a", 100), [record("b", 100)], None).won


def test_the_earliest_claim_waits_for_the_rivals_it_saw_then_wins() -> None:
    first = judge(record("mine", 100), [record("b", 200), record("c", 300)], None)
    assert not first.won and first.holder is None
    assert first.waiting_for == {"b", "c"}
    # c withdrew; d appeared meanwhile, later: it is not waited for (it waits for this one)
    second = judge(record("mine", 100), [record("b", 200), record("d", 50)], first.waiting_for)
    assert second.waiting_for == {"b"}
    assert judge(record("mine", 100), [record("d", 50)], second.waiting_for).won


# -- two stores, one sqlite file ----------------------------------------------------------


def open_store(uri: str) -> RunStore:
    return RunStore(resolve_tracking_uri(uri), "exp", 0.2, 5, sqlite_wal=True)


@pytest.fixture
def stores(mlflow_store: str) -> Iterator[tuple[RunStore, RunStore]]:
    first, second = open_store(mlflow_store), open_store(mlflow_store)
    first.start_sweep("sweep a", {})
    second.start_sweep("sweep b", {})
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def request(fp: str = "fp", resumes: RunRecord | None = None) -> ClaimRequest:
    tags = {Tags.FINGERPRINT: fp, Tags.JOB_NUM: "0"}
    return ClaimRequest(fp, f"job {fp}", tags, {} if resumes else {"lr": "0.1"}, resumes)


def active_runs(store: RunStore, fp: str = "fp") -> list[RunRecord]:
    from furcate_hydra.store.lookup import find_runs

    return find_runs(store.client, store.experiment_id, [fp]).get(fp, [])


def test_a_second_claim_loses_to_a_won_one_and_leaves_no_trace(
    stores: tuple[RunStore, RunStore],
) -> None:
    first, second = stores
    (won,) = first.claim([request()])
    assert won.won
    run_id = first.confirm(won)
    (lost,) = second.claim([request()])
    assert lost.holder is not None and lost.holder.run_id == run_id
    # the lost claim's run: KILLED, saying to whom it lost, deleted (out of the UI and lookups)
    gone = second.client.get_run(lost.run.run_id)
    assert gone.info.lifecycle_stage == "deleted" and gone.info.status == "KILLED"
    assert gone.data.tags[Tags.CLAIM] == f"lost to {run_id}"
    assert [r.run_id for r in active_runs(first)] == [run_id]
    decision = second.decide(["fp"], Rerun.ALL)["fp"]
    assert decision.action is Action.ELSEWHERE and decision.record is not None
    assert decision.record.run_id == run_id
    assert first.client.get_run(run_id).data.params == {"lr": "0.1"}


def test_claims_looking_at_the_same_time_leave_one_winner(
    stores: tuple[RunStore, RunStore],
) -> None:
    """Both claims are written before either looks: the earlier one waits for the other to
    see it and withdraw, then wins."""
    first, second = stores
    claims = [first.claims.write(request()), second.claims.write(request())]
    earlier = min(range(2), key=lambda i: (claims[i].run.start_time_ms, claims[i].run.run_id))
    pair = (first, second)
    settle = threading.Thread(target=pair[earlier].claims.settle, args=([claims[earlier]],))
    settle.start()
    time.sleep(0.2)  # the earlier claim has looked and waits
    assert settle.is_alive()
    pair[1 - earlier].claims.settle([claims[1 - earlier]])
    settle.join(timeout=10)
    assert not settle.is_alive()
    winner, loser = claims[earlier], claims[1 - earlier]
    assert winner.won and loser.holder is not None
    assert loser.holder.run_id == winner.run.run_id
    assert [r.run_id for r in active_runs(first)] == [claims[earlier].run.run_id]


def test_a_late_claim_with_an_earlier_clock_cannot_win_too(
    stores: tuple[RunStore, RunStore],
) -> None:
    """A claim written after another looked and won, but carrying an earlier start time (a
    launcher whose write waited on a busy store, or whose clock is behind): the first one's
    mark decides, not the clocks."""
    first, second = stores
    (won,) = first.claim([request()])
    assert won.won and won.opened is None  # won, not yet marked
    tags = second.job_run_tags({Tags.FINGERPRINT: "fp"})
    early = won.run.start_time_ms - 60_000
    run = second.client.create_run(second.experiment_id, start_time=early, tags=tags)
    late = Claim(request(), RunRecord(run.info.run_id, "fp", RunStatus.RUNNING, early, tags))
    settle = threading.Thread(target=second.claims.settle, args=([late],))
    settle.start()
    time.sleep(0.2)
    assert settle.is_alive(), "the earlier-clocked claim must wait for the one it saw"
    first.confirm(won)
    settle.join(timeout=10)
    assert late.holder is not None and late.holder.run_id == won.run.run_id
    assert [r.run_id for r in active_runs(first)] == [won.run.run_id]


def test_a_config_without_params_is_marked_won_by_a_tag(
    stores: tuple[RunStore, RunStore],
) -> None:
    first, second = stores
    empty = ClaimRequest("fp", "job", {Tags.FINGERPRINT: "fp"}, {})
    (won,) = first.claim([empty])
    run_id = first.confirm(won)
    assert first.client.get_run(run_id).data.tags[Tags.CLAIM] == WON
    (lost,) = second.claim([empty])
    assert lost.holder is not None and lost.holder.run_id == run_id


def test_a_claim_of_a_gone_launcher_is_no_rival(stores: tuple[RunStore, RunStore]) -> None:
    first, _ = stores
    tags = {Tags.FINGERPRINT: "fp", Tags.CLAIM: WON, **exited_launcher().tags()}
    first.client.create_run(first.experiment_id, tags=tags)
    (claim,) = first.claim([request()])
    assert claim.won


def test_a_resume_is_claimed_by_a_stand_in_and_one_launcher_reopens_the_run(
    stores: tuple[RunStore, RunStore],
) -> None:
    first, second = stores
    tags = {Tags.FINGERPRINT: "fp", Tags.CLAIM: WON, **exited_launcher().tags()}
    interrupted = first.client.create_run(first.experiment_id, tags=tags).info.run_id
    decisions = [s.decide(["fp"], Rerun.FAILED)["fp"] for s in stores]
    assert [d.action for d in decisions] == [Action.RESUME, Action.RESUME]
    one = first.claims.write(request(resumes=decisions[0].record))
    two = second.claims.write(request(resumes=decisions[1].record))
    assert one.run.run_id != interrupted and one.run.tags[Tags.ROLE] == "claim"
    earlier, later = sorted([(first, one), (second, two)], key=lambda p: p[1].run.start_time_ms)
    settle = threading.Thread(target=earlier[0].claims.settle, args=([earlier[1]],))
    settle.start()
    time.sleep(0.2)
    later[0].claims.settle([later[1]])
    settle.join(timeout=10)
    assert earlier[1].won and later[1].holder is not None
    assert earlier[0].confirm(earlier[1]) == interrupted
    run = first.client.get_run(interrupted)
    assert run.info.status == "RUNNING" and run.data.tags[Tags.RESUMED] == "1"
    assert run.data.tags[Tags.PARENT_RUN] == earlier[0].sweep_run_id
    assert [r.run_id for r in active_runs(first)] == [interrupted]  # both stand-ins deleted
    # the loser waited for the winner's stand-in, which is gone: decided again, it waits for
    # the resumed run
    (followed,) = later[0].follow([later[1].holder], Rerun.FAILED)
    assert followed is not None and followed.action is Action.ELSEWHERE
    assert followed.record is not None and followed.record.run_id == interrupted


def test_a_claim_stopped_before_its_job_started_is_withdrawn(
    stores: tuple[RunStore, RunStore],
) -> None:
    first, _ = stores
    (claim,) = first.claim([request()])
    first.withdraw(claim)
    assert first.client.get_run(claim.run.run_id).info.lifecycle_stage == "deleted"
    assert first.decide(["fp"], Rerun.FAILED)["fp"].action is Action.RUN


def test_follow_reports_what_became_of_a_run_held_elsewhere(
    stores: tuple[RunStore, RunStore],
) -> None:
    first, second = stores
    held = {}
    for fp in ("done", "failed", "stopped", "running"):
        (claim,) = first.claim([request(fp)])
        first.confirm(claim)
        (lost,) = second.claim([request(fp)])
        assert lost.holder is not None
        held[fp] = lost.holder
    first.finish_job_run(held["done"].run_id, RunStatus.FINISHED, return_value=0.5)
    first.finish_job_run(held["failed"].run_id, RunStatus.FAILED, error="ValueError: bad lr")
    first.finish_job_run(held["stopped"].run_id, RunStatus.KILLED, error="launcher stopped")
    followed = dict(zip(held, second.follow(list(held.values()), Rerun.FAILED), strict=True))
    done, failed = followed["done"], followed["failed"]
    assert done is not None and done.action is Action.SKIP and done.ran_elsewhere
    assert done.record is not None and second.recorded_return_value(done.record) == 0.5
    assert failed is not None and failed.action is Action.REPORT_FAILURE and failed.ran_elsewhere
    assert failed.record is not None and failed.record.tags[Tags.ERROR] == "ValueError: bad lr"
    stopped = followed["stopped"]  # the other launcher let it go: resumed here
    assert stopped is not None and stopped.action is Action.RESUME
    assert followed["running"] is None
