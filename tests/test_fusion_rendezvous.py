"""Members of a fused group find each other across real processes: one leads, the others
follow, a member whose job ended before its fit is not waited for; the leader trains the
group and hands each member its own run's end."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

from furcate_hydra.fusion.rendezvous import Leading, RendezvousError, join, left

FORK = multiprocessing.get_context("fork")
SECRET = b"the group's key, as the launcher hands it down"


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    warnings.filterwarnings("ignore", module="lightning")


def member(directory: Path, key: str, size: int, results: Any) -> None:
    """A member process: join, and report what it learned."""
    role = join(directory, key, size, {"key": key, "pid": os.getpid()}, timeout_s=30, secret=SECRET)
    if isinstance(role, Leading):
        keys = [m.key for m in role.members]
        for joined in role.members:
            role.send(joined.key, ("you are", joined.key, "of", keys))
        results.put(("leader", key, sorted(keys), [m.payload["key"] for m in role.members]))
        role.close()
    else:
        results.put(("follower", key, role.receive(timeout_s=30)))


def run_members(directory: Path, keys: list[str], size: int) -> list[Any]:
    results = FORK.Queue()
    processes = [FORK.Process(target=member, args=(directory, k, size, results)) for k in keys]
    for process in processes:
        process.start()
    got = [results.get(timeout=60) for _ in keys]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return got


def test_one_member_leads_and_every_other_hears_from_it(tmp_path: Path) -> None:
    keys = [f"job{i}" for i in range(5)]
    got = run_members(tmp_path, keys, size=5)
    (leader,) = [g for g in got if g[0] == "leader"]
    assert leader[2] == sorted(keys) and sorted(leader[3]) == sorted(keys)  # every payload
    followers = [g for g in got if g[0] == "follower"]
    assert len(followers) == 4
    for _, key, message in followers:
        assert message[:2] == ("you are", key) and sorted(message[3]) == sorted(keys)


def test_a_member_that_left_before_its_fit_is_not_waited_for(tmp_path: Path) -> None:
    left(tmp_path, "job2")
    got = run_members(tmp_path, ["job0", "job1", "job3"], size=4)
    (leader,) = [g for g in got if g[0] == "leader"]
    assert leader[2] == ["job0", "job1", "job3"]


def test_a_leader_whose_members_never_come_trains_those_that_did_and_late_ones_run_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        leading = join(tmp_path, "job0", 3, None, timeout_s=0.3, secret=SECRET)
    assert isinstance(leading, Leading) and [m.key for m in leading.members] == ["job0"]
    assert "2 of 3 members of the fused group did not reach their fit in 0 s" in caplog.text
    leading.close()
    with pytest.raises(RendezvousError, match="had stopped waiting for members"):
        join(tmp_path, "job1", 3, None, timeout_s=0.3, secret=SECRET)


def joins_and_ends(directory: Path) -> None:
    join(directory, "job1", 3, {"key": "job1"}, timeout_s=30, secret=SECRET)
    os._exit(0)  # its job ended after it joined (it crashed): the launcher marks it left


def test_a_member_that_joined_and_then_ended_is_counted_once(tmp_path: Path) -> None:
    results = FORK.Queue()
    leader = FORK.Process(target=member, args=(tmp_path, "job0", 3, results))
    leader.start()
    while not (tmp_path / "leader").exists():
        time.sleep(0.01)
    early = FORK.Process(target=joins_and_ends, args=(tmp_path,))
    early.start()
    early.join(timeout=30)
    left(tmp_path, "job1")
    time.sleep(0.3)  # the leader still waits: job2 has neither joined nor left
    late = FORK.Process(target=member, args=(tmp_path, "job2", 3, results))
    late.start()
    got = [results.get(timeout=60) for _ in range(2)]
    for process in (leader, late):
        process.join(timeout=30)
        assert process.exitcode == 0  # telling the ended member its end broke nothing
    (leading,) = [g for g in got if g[0] == "leader"]
    assert leading[2] == ["job0", "job1", "job2"]


def test_a_follower_without_a_leader_says_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "leader").write_text(str(os.getpid()))  # a leader alive that never listened
    with pytest.raises(RendezvousError, match="no leader of the group in"):
        join(tmp_path, "job1", 2, None, timeout_s=0.3, secret=SECRET)


def test_a_follower_does_not_wait_for_a_leader_whose_process_is_gone(tmp_path: Path) -> None:
    gone = FORK.Process(target=os._exit, args=(0,))
    gone.start()
    gone.join()
    (tmp_path / "leader").write_text(str(gone.pid))  # it marked the group, then died
    began = time.monotonic()
    with pytest.raises(RendezvousError, match=f"leader \\(pid {gone.pid}\\) is gone"):
        join(tmp_path, "job1", 2, None, timeout_s=30, secret=SECRET)
    assert time.monotonic() - began < 5


def leader_that_dies(directory: Path) -> None:
    join(directory, "job0", 2, None, timeout_s=30, secret=SECRET)
    os._exit(0)  # gone without a word to its member


def follows_a_leader_that_dies(directory: Path, results: Any) -> None:
    follower = join(directory, "job1", 2, None, timeout_s=30, secret=SECRET)
    try:
        follower.receive(timeout_s=10)  # type: ignore[union-attr]
    except RendezvousError as exc:
        results.put((type(follower).__name__, str(exc)))


def test_a_follower_whose_leader_died_says_so(tmp_path: Path) -> None:
    # both are jobs of the sweep: children of one process, as a fork server's are
    results = FORK.Queue()
    process = FORK.Process(target=leader_that_dies, args=(tmp_path,))
    process.start()
    while not (tmp_path / "leader").exists():  # it leads: the other follows
        time.sleep(0.01)
    follower = FORK.Process(target=follows_a_leader_that_dies, args=(tmp_path, results))
    follower.start()
    said = ("Following", "the group's leader is gone (its process ended)")
    assert results.get(timeout=60) == said
    process.join(timeout=30)
    follower.join(timeout=30)


def fused_member(directory: Path, index: int, size: int, results: Any) -> None:
    """A member process as a job's fit is: its fit brought to the group by the job side's
    ``join_group``, trained or told to run alone."""
    import lightning as L

    from furcate_hydra.fusion.coordinator import EpochEnd, Trained
    from furcate_hydra.lightning._fused_group import GroupEnv
    from furcate_hydra.lightning._fused_member import join_group
    from tests.test_fusion_engine import CONFIGS, QUIET, WithMetric, _loaders, _member

    train, val = _loaders()
    module = WithMetric() if index == len(CONFIGS) else _member(index, *CONFIGS[index])
    trainer = L.Trainer(**QUIET, max_epochs=3)
    epochs: list[EpochEnd] = []  # each epoch's end as it comes, before the member's end
    group = GroupEnv(directory, size, f"job{index}", fuse_max=8, gather_s=60, secret=SECRET)
    arguments = {"model": module, "train_dataloaders": train, "val_dataloaders": val}
    end = join_group(group, trainer, arguments, None, epochs.append)
    if isinstance(end, Trained):
        # epochs are kept every few seconds, not each one: under load some are kept together
        kept = [e.checkpoint["epoch"] for e in epochs]
        assert kept == sorted(set(kept)) and set(kept) <= {1, 2, 3}
        told = [r.epoch for e in epochs for r in e.log.epochs] + [r.epoch for r in end.log.epochs]
        assert told == [0, 1, 2]  # every epoch once: kept as it came, or with the end
        module.load_state_dict(end.checkpoint["state_dict"])
        weights = {k: v.tolist() for k, v in module.state_dict().items()}
        results.put((index, "trained", weights, end.group, sorted(end.callback_metrics)))
    else:
        results.put((index, "alone", end.reason))


@pytest.mark.parametrize("metric_leads", [False, True])
def test_a_group_formed_across_processes_hands_each_member_its_own_run(
    tmp_path: Path, metric_leads: bool
) -> None:
    import torch

    from tests.test_fusion_engine import CONFIGS, _alone

    # members as jobs are: forks of a process that has imported torch but run nothing with
    # it (a fork of this test's process, which may have, can hang in OpenMP's thread pool)
    warm = multiprocessing.get_context("forkserver")
    warm.set_forkserver_preload(["torch", "lightning", "tests.test_fusion_engine"])
    size = len(CONFIGS) + 1
    results = warm.Queue()
    processes = [
        warm.Process(target=fused_member, args=(tmp_path, i, size, results)) for i in range(size)
    ]
    if metric_leads:  # the leader runs alone: its group trains on loaders it asks for
        processes[-1].start()
        while not (tmp_path / "leader").exists():
            time.sleep(0.01)
    for process in processes:
        if process.pid is None:
            process.start()
    got = {item[0]: item[1:] for item in (results.get(timeout=180) for _ in processes)}
    for process in processes:
        process.join(timeout=30)
    assert got[len(CONFIGS)] == ("alone", "MulticlassAccuracy updated inside training_step")
    for index, (lr, wd) in enumerate(CONFIGS):
        kind, weights, group, metrics = got[index]
        assert kind == "trained" and sorted(group) == [f"job{i}" for i in range(len(CONFIGS))]
        assert metrics == ["train_loss", "train_loss_epoch", "train_loss_step", "val_loss"]
        alone, _ = _alone(index, lr, wd, {"max_epochs": 3})
        for name, value in alone.state_dict().items():
            assert torch.equal(torch.tensor(weights[name]), value), name


def after_the_leader(directory: Path, target: Any, *args: Any) -> None:
    """``target(*args)`` once the group has a leader: this process follows."""
    while not (directory / "leader").exists():
        time.sleep(0.01)
    target(*args)


def follower_that_dies(directory: Path, key: str) -> None:
    join(directory, key, 3, {"key": key}, timeout_s=30, secret=SECRET)
    os._exit(0)  # joined, then gone: killed while its group trains


def test_a_follower_gone_while_its_group_trains_leaves_the_others_their_ends(
    tmp_path: Path,
) -> None:
    results = FORK.Queue()
    gone = FORK.Process(
        target=after_the_leader, args=(tmp_path, follower_that_dies, tmp_path, "job1")
    )
    other = FORK.Process(
        target=after_the_leader, args=(tmp_path, member, tmp_path, "job2", 3, results)
    )
    gone.start()
    other.start()
    leader = FORK.Process(target=leads_past_a_gone_member, args=(tmp_path, gone, results))
    leader.start()
    got = {results.get(timeout=60) for _ in range(2)}
    asked = ("asked job1", "member job1 ended before it answered")
    assert got == {("follower", "job2", "your end"), asked}
    for process in (leader, other, gone):
        process.join(timeout=30)
    assert leader.exitcode == 0


def leads_past_a_gone_member(directory: Path, gone: Any, results: Any) -> None:
    leading = join(directory, "job0", 3, {"key": "job0"}, timeout_s=30, secret=SECRET)
    assert isinstance(leading, Leading)
    while psutil.pid_exists(gone.pid) and psutil.Process(gone.pid).status() != "zombie":
        time.sleep(0.01)  # (its sibling: not this process's child to join)
    leading.send("job1", "your end")  # its line is closed: nothing is raised
    try:
        leading.ask("job1", "send your loaders")
    except RendezvousError as exc:
        results.put(("asked job1", str(exc)))
    leading.send("job2", "your end")
    leading.close()
