"""Fused trials through the real Hydra CLI: an app with its own Trainer (``apps/fused_app.py``),
swept with ``hydra.launcher.fuse=auto``, trains the configs that can share a process as one,
and each config still ends as its own run would: the same weights, history, metrics and
return value as the same sweep with ``fuse=off`` (one process per config), in its own run."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import torch
from mlflow.tracking import MlflowClient

from furcate_hydra import env_vars
from furcate_hydra.layout import JobPaths
from furcate_hydra.progress import read_progress
from furcate_hydra.store import Tags
from tests.conftest import APPS, run_cli
from tests.process_helpers import still_alive, wait_for
from tests.store_helpers import job_runs

APP = APPS / "fused_app.py"
FURCATE = "hydra/launcher=furcate"


def sweep(work: Path, name: str, *overrides: str) -> tuple[Path, str]:
    """The app's sweep into ``work/name`` (one slot: every job of it on one slot's seats), its
    dir and its output."""
    result = run_cli(
        APP,
        "-m",
        FURCATE,
        "hydra.launcher.max_workers=1",
        f"hydra.sweep.dir={work / name}",
        *overrides,
        cwd=work,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work / name, result.stdout + result.stderr


def job_log(job_dir: Path) -> str:
    return "".join((job_dir / name).read_text() for name in ("stdout.log", "stderr.log"))


def sweep_alone(work: Path, empty_store: Path, *overrides: str) -> str:
    """The same grid one process per config (``fuse=off``) into ``work/alone``, recording
    into an empty store of its own (else it would skip): that store's URI."""
    shutil.copyfile(empty_store, work / "alone.db")
    store = f"sqlite:///{work / 'alone.db'}"
    result = run_cli(
        APP, "-m", FURCATE, "hydra.launcher.max_workers=1", f"hydra.sweep.dir={work / 'alone'}",
        *overrides, cwd=work, env={**os.environ, "MLFLOW_TRACKING_URI": store},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return store


def assert_same_weights(job_dir: Path, alone_dir: Path, config: object) -> None:
    """The weights the app saved after fit are the unfused run's, bitwise (no tolerance)."""
    mine, theirs = torch.load(job_dir / "weights.pt"), torch.load(alone_dir / "weights.pt")
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), (config, name)


def by_overrides(store: str) -> dict[tuple[str | None, ...], Any]:
    """The jobs' runs by their config (lr, weight_decay, batch_size, module)."""
    runs: dict[tuple[str | None, ...], Any] = {}
    for run in job_runs(store):
        p = run.data.params
        runs[(p["lr"], p["weight_decay"], p.get("batch_size"), p.get("module"))] = run
    return runs


def histories(store: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(store)
    keys = client.get_run(run_id).data.metrics
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in keys
    }


def test_a_grid_fuses_into_one_process_and_each_config_ends_as_its_own_run(
    tmp_path: Path, mlflow_store: str, empty_mlflow_db: Path
) -> None:
    grid = ["lr=0.003,0.05", "weight_decay=0.0,0.1", "early_stop=true", "epochs=8"]
    work = tmp_path
    # fuse_max unset, and no doubling can gain 900 %: the group's four train two at a time,
    # one part after the other, in one process (each part shown the same batches)
    fused = ["hydra.launcher.fuse=auto", "hydra.launcher.auto_min_gain=9"]
    fused_dir, said = sweep(work, "fused", *fused, *grid)
    alone_store = sweep_alone(work, empty_mlflow_db, *grid)
    fused_runs, alone_runs = by_overrides(mlflow_store), by_overrides(alone_store)
    assert len(fused_runs) == 4 and fused_runs.keys() == alone_runs.keys()
    assert not {r.info.run_id for r in fused_runs.values()} & {
        r.info.run_id for r in alone_runs.values()
    }
    stopped_at, leaders = set(), 0
    for config, run in fused_runs.items():
        alone = alone_runs[config]
        assert run.info.status == "FINISHED", config
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        alone_dir = Path(alone.data.tags[Tags.OUTPUT_DIR])
        assert job_dir.parent == fused_dir
        assert "furcate: fused: trained with 4 member(s) in one process" in job_log(job_dir)
        assert "steps), 2 at a time" in job_log(job_dir)
        leaders += job_log(job_dir).count(
            "fused: 4 member(s) train 2 at a time (from 1 to 2 a member's share"
        )
        assert_same_weights(job_dir, alone_dir, config)
        history = json.loads((job_dir / JobPaths.HISTORY).read_text())
        alone_history = json.loads((alone_dir / JobPaths.HISTORY).read_text())
        assert [(r["epoch"], r["step"]) for r in history] == [
            (r["epoch"], r["step"]) for r in alone_history
        ]
        stopped_at.add(len(history))
        for row, alone_row in zip(history, alone_history, strict=True):
            assert row.keys() == alone_row.keys()
            for key, value in alone_row.items():
                assert math.isclose(row[key], value, rel_tol=1e-6), (config, key)
        # every metric its loggers got, at the steps Lightning logs them
        got, want = (
            histories(mlflow_store, run.info.run_id),
            histories(alone_store, alone.info.run_id),
        )
        assert got.keys() == want.keys()
        for key, points in want.items():
            assert [s for s, _ in got[key]] == [s for s, _ in points], key
            for (_, a), (_, b) in zip(got[key], points, strict=True):
                assert math.isclose(a, b, rel_tol=1e-6), key
        assert math.isclose(
            float(run.data.metrics["val_loss"]), float(alone.data.metrics["val_loss"]), rel_tol=1e-6
        )
        assert (job_dir / "final.ckpt").is_file() and list((job_dir / "plots").glob("*.png"))
        artifacts = {a.path for a in MlflowClient(mlflow_store).list_artifacts(run.info.run_id)}
        assert {"history.json", "checkpoints", "plots"} <= artifacts
    assert "4 finished" in said
    assert leaders == 1  # the leader measured and said how many train at once
    assert min(stopped_at) < 8 and len(stopped_at) > 1  # each stopped where its run did
    # the same command again: every config is recorded, none trains
    _, again = sweep(work, "again", *fused, *grid)
    assert "4 skipped" in again, again


def test_what_cannot_share_a_group_splits_or_runs_alone_and_says_why(
    tmp_path: Path, mlflow_store: str
) -> None:
    sweep_dir, _ = sweep(
        tmp_path,
        "sweep",
        "hydra.launcher.fuse=auto",
        "module=mlp,metric",
        "batch_size=16,32",
        "lr=0.01,0.05",
        "epochs=2",
    )
    runs = by_overrides(mlflow_store)
    assert len(runs) == 8
    for (lr, _, batch_size, model), run in runs.items():
        assert run.info.status == "FINISHED"
        said = job_log(Path(run.data.tags[Tags.OUTPUT_DIR]))
        if model == "metric":
            assert "furcate: not fused: MulticlassAccuracy updated inside training_step" in said
            assert "fused: trained with" not in said
        else:  # a group per batch size: the two learning rates of each
            assert "furcate: fused: trained with 2 member(s)" in said, (lr, batch_size)
    assert sweep_dir.is_dir()


def test_kill_9_mid_training_then_the_same_command_ends_every_member_as_if_never_stopped(
    tmp_path: Path, mlflow_store: str, empty_mlflow_db: Path
) -> None:
    work = tmp_path
    first = group_mid_training(work)
    for j in range(4):  # what the live view and `furcate status` show while the group trains
        shown = read_progress(work / "first" / str(j) / JobPaths.PROGRESS)
        assert shown is not None and shown.epoch >= 1 and "val_loss" in shown.metrics
    jobs = [child.pid for child in psutil.Process(first.pid).children(recursive=True)]
    first.kill()  # the launcher alone, as the OOM killer would
    first.wait(timeout=60)
    assert still_alive(jobs, timeout=30) == []
    assert all(epochs_kept(work / "first" / str(j)) < 4 for j in range(4))  # mid-training

    _, said = sweep(work, "second", *GROUP_OF_FOUR, *GROUP_GRID)
    assert "4 finished" in said
    alone_store = sweep_alone(work, empty_mlflow_db, *GROUP_GRID[:-1])
    resumed, alone = by_overrides(mlflow_store), by_overrides(alone_store)
    assert len(resumed) == 4
    for config, run in resumed.items():
        assert run.info.status == "FINISHED" and run.data.tags[Tags.RESUMED] == "1", config
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        assert job_dir.parent == work / "second"
        assert "furcate: not fused: it resumes from its checkpoint" in job_log(job_dir)
        alone_dir = Path(alone[config].data.tags[Tags.OUTPUT_DIR])
        assert_same_weights(job_dir, alone_dir, config)
        # the epochs its group trained before the kill are in its run, and the rest after it
        got = histories(mlflow_store, run.info.run_id)["val_loss"]
        want = histories(alone_store, alone[config].info.run_id)["val_loss"]
        assert [s for s, _ in got] == [s for s, _ in want]
        history = json.loads((job_dir / JobPaths.HISTORY).read_text())
        assert [row["epoch"] for row in history] == [0, 1, 2, 3]


# four configs of a slowed app, trained as one group of four: with the width learned, a busy
# machine can answer 2, and then the first two would end before the last two reached their
# second epoch
GROUP_GRID = ["lr=0.01,0.05", "weight_decay=0.0,0.1", "epochs=4", "sample_sleep=0.04"]
GROUP_OF_FOUR = ["hydra.launcher.fuse=auto", "hydra.launcher.fuse_max=4"]


def group_mid_training(work: Path) -> subprocess.Popen[bytes]:
    """GROUP_GRID's sweep into ``work/first``, started and let run until every member kept
    two epochs: its launcher."""
    command = [
        sys.executable, str(APP), "-m", FURCATE, "hydra.launcher.max_workers=1",
        *GROUP_OF_FOUR, f"hydra.sweep.dir={work / 'first'}", *GROUP_GRID,
    ]  # fmt: skip
    launcher = subprocess.Popen(
        command, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: all(epochs_kept(work / "first" / str(j)) >= 2 for j in range(4)), launcher,
             "two epochs of every member kept")  # fmt: skip
    return launcher


def epochs_kept(job_dir: Path) -> int:
    """Epochs done by the newest checkpoint furcate kept for the job (0: none yet)."""
    pointer = job_dir / JobPaths.CHECKPOINTS / "last.json"
    if not pointer.exists():
        return 0
    return int(json.loads(pointer.read_text())["epoch"]) + 1


def test_optuna_hands_a_fused_slot_its_trials_and_prunes_each_member_by_its_own_values(
    tmp_path: Path, mlflow_store: str
) -> None:
    import optuna
    from optuna.trial import TrialState

    epochs = 6
    sweep(
        tmp_path, "study",
        "hydra/sweeper=furcate_optuna", "hydra/sweeper/pruner=median",
        "hydra.launcher.fuse=auto", "hydra.launcher.fuse_max=4",
        "hydra.sweeper.n_trials=8", "hydra.sweeper.direction=minimize",
        "hydra.sweeper.monitor=val_loss", "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.pruner.n_startup_trials=4", "hydra.sweeper.pruner.n_warmup_steps=1",
        "+hydra.sweeper.params.lr='tag(log, interval(1e-5, 0.3))'", f"epochs={epochs}",
    )  # fmt: skip
    study = optuna.load_study(study_name="fused_app", storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 8
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned and all(t.state != TrialState.FAIL for t in trials), [t.state for t in trials]
    runs = {run.data.tags[Tags.OUTPUT_DIR]: run for run in job_runs(mlflow_store)}
    assert len(runs) == 8
    for job_dir in runs:
        # the sweeper asked as many trials as the slot's group holds: they trained as one
        assert "furcate: fused: trained with 4 member(s)" in job_log(Path(job_dir)), job_dir
    for trial in trials:
        reported = sorted(trial.intermediate_values)
        assert reported == list(range(len(reported)))  # each epoch's own value, in order
        if trial.state == TrialState.PRUNED:
            assert trial.system_attrs[env_vars.PRUNED_AT_EPOCH_ATTR] == reported[-1]
            assert 1 <= reported[-1] < epochs - 1
        else:
            assert len(reported) == epochs
    # a pruned member stopped where its trial was pruned: its history ends there
    lengths = {len(json.loads((Path(d) / JobPaths.HISTORY).read_text())) for d in runs}
    assert min(lengths) < epochs == max(lengths)


def test_a_preempted_group_is_queued_again_and_every_member_resumes_from_its_last_kept_epoch(
    tmp_path: Path, mlflow_store: str, empty_mlflow_db: Path
) -> None:
    grid = ["lr=0.01,0.05", "weight_decay=0.0,0.1", "epochs=4", "sample_sleep=0.04"]
    command = [
        sys.executable, str(APP), "-m", FURCATE, "hydra.launcher.max_workers=1",
        "hydra.launcher.fuse=auto", "hydra.launcher.fuse_max=4",  # all four mid-training
        f"hydra.sweep.dir={tmp_path / 'sweep'}", *grid,
    ]  # fmt: skip
    launcher = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: all(epochs_kept(tmp_path / "sweep" / str(j)) >= 2 for j in range(4)),
             launcher, "two epochs of every member kept")  # fmt: skip
    # the jobs: the fork server's children (the launcher's own child is the fork server)
    members = [
        child
        for child in psutil.Process(launcher.pid).children(recursive=True)
        if child.ppid() != launcher.pid
    ]
    assert len(members) == 4
    for member in members:  # a preemption of the machine: every job is signalled
        member.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output
    assert "4 finished" in output, output

    alone = by_overrides(sweep_alone(tmp_path, empty_mlflow_db, *grid[:-1]))
    for config, run in by_overrides(mlflow_store).items():
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        said = job_log(job_dir)  # its last attempt's: queued again alone, it resumed
        assert f"Trainer gets resume from {job_dir / JobPaths.CHECKPOINTS}/epoch=" in said, said
        assert run.data.tags[Tags.PREEMPTIONS] == "1"  # queued again once, into its own run
        alone_dir = Path(alone[config].data.tags[Tags.OUTPUT_DIR])
        assert_same_weights(job_dir, alone_dir, config)
        history = json.loads((job_dir / JobPaths.HISTORY).read_text())
        assert [row["epoch"] for row in history] == [0, 1, 2, 3]


def test_a_leader_killed_mid_training_leaves_its_followers_to_go_on_from_their_kept_epochs(
    tmp_path: Path, mlflow_store: str, empty_mlflow_db: Path
) -> None:
    work = tmp_path
    launcher = group_mid_training(work)
    leader = group_leader(launcher.pid)
    os.kill(leader, signal.SIGKILL)  # the leader alone: its followers must go on
    assert launcher.wait(timeout=300) is not None

    alone_store = sweep_alone(work, empty_mlflow_db, *GROUP_GRID[:-1])
    runs, alone = by_overrides(mlflow_store), by_overrides(alone_store)
    followers = {c: r for c, r in runs.items() if r.info.status == "FINISHED"}
    assert len(followers) == 3, {c: r.info.status for c, r in runs.items()}
    for config, run in followers.items():
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        assert "furcate: not fused: its group did not form" in job_log(job_dir), config
        assert_same_weights(job_dir, Path(alone[config].data.tags[Tags.OUTPUT_DIR]), config)
        # its group's epochs and its own after them, each logged once
        got = histories(mlflow_store, run.info.run_id)["val_loss"]
        want = histories(alone_store, alone[config].info.run_id)["val_loss"]
        assert [s for s, _ in got] == [s for s, _ in want]


def group_leader(launcher: int) -> int:
    """The pid of the fused group's leader among the launcher's jobs (its mark is in the
    group's dir, which the launcher makes in the temp dir)."""
    jobs = {child.pid for child in psutil.Process(launcher).children(recursive=True)}
    for mark in Path(tempfile.gettempdir()).glob("furcate-fused-*/group-*/leader"):
        text = mark.read_text() if mark.is_file() else ""
        if text and int(text) in jobs:
            return int(text)
    raise AssertionError("no fused group's leader among the launcher's jobs")
