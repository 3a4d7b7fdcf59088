"""Exact mid-epoch resume, step and time checkpoints, and a checkpoint at SIGTERM/SIGUSR1.

The model (``tests/apps/dropout_regression.py``) draws random numbers in dropout and in its
dataset's augmentation, from the app's own DataLoader (shuffled from the global stream, by a
generator of its own, or an IterableDataset). A real signal, sent by the training process
to itself in the middle of a step, interrupts a fit; another fit in the same checkpoint dir
resumes it after the process's random generators were scrambled. Weights are compared bitwise
with the same training left uninterrupted and with Lightning alone, no furcate anywhere.
"""

from __future__ import annotations

import json
import random
import re
import signal
from pathlib import Path
from typing import Any

import pytest

STOP_AT = 11  # global step 11: batch 3 (0-based) of epoch 1, of 8 batches per epoch


def env(root: Path, **fields: Any) -> Any:
    from furcate_hydra.lightning import JobEnv

    return JobEnv(root / "out", root / "checkpoints", **fields)


def scramble_generators() -> None:
    """What a fresh process would have: nothing of the interrupted fit's random state."""
    import numpy as np
    import torch

    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)


def interrupted_then_resumed(
    root: Path, signum: int = signal.SIGTERM, **options: Any
) -> tuple[Any, Any]:
    """Train until the process signals itself at STOP_AT, then resume: the model and result."""
    from furcate_hydra.preemption import PREEMPTED_EXIT_CODE, JobPreempted
    from tests.apps.dropout_regression import train

    with pytest.raises(JobPreempted) as stopped:
        train(env(root), model={"signal_at": STOP_AT, "signum": signum}, **options)
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert stopped.value.signal_name == signal.Signals(signum).name
    # saved at the end of the step the signal interrupted, inside epoch 1
    assert stopped.value.checkpoint == f"epoch=0001-step={STOP_AT + 1:08d}.ckpt"
    scramble_generators()
    return train(env(root), **options)


@pytest.mark.parametrize(
    ("data", "workers"),
    [("shuffled", 0), ("shuffled", 2), ("generator", 0), ("stream", 0), ("stream", 2)],
)
def test_resumed_mid_epoch_ends_bitwise_equal_to_lightning_alone(
    tmp_path: Path, data: str, workers: int
) -> None:
    """The test of record: dropout, augmentation and the app's own loader, CPU, deterministic:
    uninterrupted and resumed mid-epoch, the weights are those of Lightning alone."""
    import torch

    from tests.apps.dropout_regression import BATCHES_PER_EPOCH, train, train_alone, weights

    alone = weights(train_alone(tmp_path / "alone", workers=workers, data=data))
    uninterrupted, whole = train(env(tmp_path / "a"), workers=workers, data=data)
    resumed, result = interrupted_then_resumed(tmp_path / "b", workers=workers, data=data)

    assert result.resumed_at_epoch == 1
    assert result.resumed_at_batch == (STOP_AT + 1) % BATCHES_PER_EPOCH
    for got in (weights(uninterrupted), weights(resumed)):
        assert all(torch.equal(alone[name], got[name]) for name in alone)
    # the interrupted epoch's mean is over all its batches, those before the stop included
    rows, whole_rows = (json.loads(r.history_path.read_text()) for r in (result, whole))
    assert rows == whole_rows


@pytest.mark.slow  # CI runs it; SIGTERM's test covers the path in the quick suite
def test_sigusr1_checkpoints_and_stops_as_sigterm_does(tmp_path: Path) -> None:
    from tests.apps.dropout_regression import train, weights_digest

    uninterrupted, _ = train(env(tmp_path / "a"), epochs=2)
    resumed, _ = interrupted_then_resumed(tmp_path / "b", signal.SIGUSR1, epochs=2)
    assert weights_digest(resumed) == weights_digest(uninterrupted)


def test_step_checkpoints_only_at_batches_nothing_is_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from furcate_hydra.lightning._checkpoint import read_pointer
    from tests.apps.dropout_regression import train

    saved = record_saves(monkeypatch)
    root = tmp_path / "run"
    # every step, but with two batches per optimizer step: saves only after a step is whole
    train(env(root, checkpoint_every_n_steps=1), epochs=2, accumulate_grad_batches=2)
    # 4 optimizer steps per epoch; never the epoch's last batch (its epoch checkpoint follows)
    assert saved == [
        "epoch=0000-step=00000001.ckpt",
        "epoch=0000-step=00000002.ckpt",
        "epoch=0000-step=00000003.ckpt",
        "epoch=0000.ckpt",
        "epoch=0001-step=00000005.ckpt",
        "epoch=0001-step=00000006.ckpt",
        "epoch=0001-step=00000007.ckpt",
        "epoch=0001.ckpt",
    ]
    pointer = read_pointer(root / "checkpoints")
    assert pointer is not None
    assert [e.file for e in pointer.entries] == ["epoch=0001.ckpt", "epoch=0001-step=00000007.ckpt"]
    assert pointer.entries[1].batch == 6 and pointer.batch is None
    # pruned: only what the pointer names is left
    assert sorted(p.name for p in (root / "checkpoints").glob("*.ckpt")) == [
        "epoch=0001-step=00000007.ckpt",
        "epoch=0001.ckpt",
    ]


def test_time_checkpoints_follow_every_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.apps.dropout_regression import BATCHES_PER_EPOCH, train

    saved = record_saves(monkeypatch)
    train(env(tmp_path, checkpoint_every_s=1e-6), epochs=1)
    # due after every batch: each one but the last, then the epoch's own
    assert len(saved) == BATCHES_PER_EPOCH
    assert saved[-1] == "epoch=0000.ckpt"


def test_step_checkpoints_off_when_the_data_cannot_resume(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from furcate_hydra.lightning import ResumeNotExactWarning, fit
    from furcate_hydra.preemption import JobPreempted
    from tests.apps.dropout_regression import DropoutRegression, NoisyRows

    def run(model: DropoutRegression) -> Any:
        # workers that live on from epoch to epoch keep random streams no checkpoint holds
        data = DataLoader(NoisyRows(), batch_size=8, num_workers=1, persistent_workers=True)
        return fit(
            model,
            train_dataloaders=data,
            trainer_options={
                "max_epochs": 2,
                "accelerator": "cpu",
                "enable_progress_bar": False,
                "enable_model_summary": False,
            },
            env=env(tmp_path, checkpoint_every_n_steps=1),
        )

    with (
        pytest.warns(ResumeNotExactWarning, match="persistent_workers"),
        pytest.warns(UserWarning, match="resumes from the start of this epoch"),
        pytest.raises(JobPreempted) as stopped,
    ):
        run(DropoutRegression(signal_at=STOP_AT))
    assert stopped.value.checkpoint is None
    # only the finished epoch 0 was saved: the job resumes at the boundary, epoch 1's start
    assert [p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")] == ["epoch=0000.ckpt"]
    with pytest.warns(ResumeNotExactWarning):
        result = run(DropoutRegression())
    assert (result.resumed_at_epoch, result.resumed_at_batch) == (1, 0)


def test_damaged_newest_checkpoint_is_moved_aside_and_the_older_one_used(
    tmp_path: Path,
) -> None:
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import read_pointer
    from furcate_hydra.preemption import JobPreempted
    from tests.apps.dropout_regression import train, weights_digest

    uninterrupted, _ = train(env(tmp_path / "a"))
    root = tmp_path / "b"
    with pytest.raises(JobPreempted):
        train(env(root, checkpoint_every_n_steps=2), model={"signal_at": STOP_AT})
    checkpoints = root / "checkpoints"
    newest, older = read_pointer(checkpoints).entries  # type: ignore[union-attr]
    assert newest.file == "epoch=0001-step=00000012.ckpt"  # saved at the signal
    assert older.file == "epoch=0001-step=00000010.ckpt"  # every 2 steps, before it
    damaged = checkpoints / newest.file
    damaged.write_bytes(damaged.read_bytes()[:1000])  # truncated, as a full disk leaves it

    with pytest.warns(CheckpointCorruptWarning) as record:
        resumed, result = train(env(root))
    (warning,) = record
    message = str(warning.message)
    assert str(damaged) in message and "sha256" in message
    assert f"moved to {damaged.name}.corrupt" in message
    assert f"Resuming from the older {older.file}" in message
    assert (checkpoints / f"{damaged.name}.corrupt").exists() and not damaged.exists()
    assert result.resumed_from == checkpoints / older.file
    # an older mid-epoch checkpoint is as exact as the newest would have been
    assert weights_digest(resumed) == weights_digest(uninterrupted)


def test_job_env_reads_the_checkpoint_cadence() -> None:
    from furcate_hydra.errors import FurcateConfigError
    from furcate_hydra.lightning import JobEnv

    read = JobEnv.from_environ(
        {"FURCATE_CHECKPOINT_EVERY_N_STEPS": "50", "FURCATE_CHECKPOINT_EVERY_S": "120.5"}
    )
    assert (read.checkpoint_every_n_steps, read.checkpoint_every_s) == (50, 120.5)
    unset = JobEnv.from_environ({})
    assert (unset.checkpoint_every_n_steps, unset.checkpoint_every_s) == (None, None)
    for name, value in (
        ("FURCATE_CHECKPOINT_EVERY_N_STEPS", "0"),
        ("FURCATE_CHECKPOINT_EVERY_S", "soon"),
    ):
        with pytest.raises(FurcateConfigError, match=re.escape(f"{name}='{value}'")):
            JobEnv.from_environ({name: value})


def test_job_env_reads_how_often_progress_is_written() -> None:
    from furcate_hydra.errors import FurcateConfigError
    from furcate_hydra.lightning import JobEnv

    assert JobEnv.from_environ({}).progress_every_s == 5.0
    assert JobEnv.from_environ({"FURCATE_PROGRESS_EVERY_S": "1.0"}).progress_every_s == 1.0
    with pytest.raises(FurcateConfigError, match=re.escape("FURCATE_PROGRESS_EVERY_S='-1'")):
        JobEnv.from_environ({"FURCATE_PROGRESS_EVERY_S": "-1"})


def record_saves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the checkpoints AtomicCheckpoint saves from now on, in order."""
    from furcate_hydra.lightning._checkpoint import AtomicCheckpoint

    saved: list[str] = []
    original = AtomicCheckpoint.save

    def save(self: AtomicCheckpoint, trainer: Any, batch: int | None = None) -> Path:
        path = original(self, trainer, batch)
        saved.append(path.name)
        return path

    monkeypatch.setattr(AtomicCheckpoint, "save", save)
    return saved
