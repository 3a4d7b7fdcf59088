"""AtomicCheckpoint and resume: real Lightning fits of a tiny model on random tensors.

The tiny model and loaders are in ``lightning_helpers``, shared with the other
``test_lightning_*`` modules; torch and Lightning are imported by the tests that use them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.progress import read_progress


@pytest.fixture(scope="module")
def one_epoch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint dir after one epoch; tests copy it rather than train again."""
    from tests.lightning_helpers import run_fit, standalone_env

    env = standalone_env(tmp_path_factory.mktemp("one_epoch"))
    run_fit(env, max_epochs=1)
    return env.checkpoint_dir


def copy_of(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "checkpoints"
    shutil.copytree(source, target)
    return target


def test_pointer_names_newest_verified_file_and_only_keep_remain(tmp_path: Path) -> None:
    import torch

    from furcate_hydra.lightning._checkpoint import (
        POINTER_NAME,
        final_checkpoint,
        find_resume_checkpoint,
    )
    from tests.lightning_helpers import BATCHES_PER_EPOCH, run_fit, standalone_env

    env = standalone_env(tmp_path)
    _, result = run_fit(env, max_epochs=3)

    pointer = json.loads((env.checkpoint_dir / POINTER_NAME).read_text())
    assert pointer["file"] == "epoch=0002.ckpt"
    assert pointer["epoch"] == 2
    assert pointer["global_step"] == 3 * BATCHES_PER_EPOCH
    newest = env.checkpoint_dir / pointer["file"]
    assert hashlib.sha256(newest.read_bytes()).hexdigest() == pointer["sha256"]
    assert sorted(p.name for p in env.checkpoint_dir.iterdir()) == [
        "epoch=0001.ckpt",
        "epoch=0002.ckpt",
        POINTER_NAME,
    ]  # keep=2 pruned epoch 0; no temporary file is left behind
    assert find_resume_checkpoint(env.checkpoint_dir) == newest
    assert final_checkpoint(env.checkpoint_dir) == newest
    # Lightning's own epoch field is the finished epoch's index
    assert torch.load(newest, weights_only=False)["epoch"] == 2
    # the output dir's copy is a hard link to the same bytes
    assert result.checkpoint_path == env.output_dir / "final.ckpt"
    assert os.path.samefile(result.checkpoint_path, newest)
    assert result.resumed_from is None and result.resumed_at_epoch is None
    assert result.epochs_completed == 3


def test_resume_runs_only_the_remaining_epochs(tmp_path: Path) -> None:
    from furcate_hydra.lightning._checkpoint import read_pointer
    from tests.lightning_helpers import history_epochs, run_fit, standalone_env

    first_env = standalone_env(tmp_path / "first", checkpoint_dir=tmp_path / "run-ckpt")
    first, _ = run_fit(first_env, max_epochs=2)
    assert first.epochs_run == [0, 1]

    # a relaunch of the same run gets a new output dir but the same checkpoint dir
    second_env = standalone_env(tmp_path / "second", checkpoint_dir=tmp_path / "run-ckpt")
    second, result = run_fit(second_env, max_epochs=4)

    assert second.epochs_run == [2, 3]
    assert result.resumed_at_epoch == 2
    assert result.resumed_from == second_env.checkpoint_dir / "epoch=0001.ckpt"
    assert result.epochs_completed == 4
    assert history_epochs(result.history_path) == [0, 1, 2, 3]
    assert read_pointer(second_env.checkpoint_dir) is not None
    assert read_pointer(second_env.checkpoint_dir).file == "epoch=0003.ckpt"  # type: ignore[union-attr]


def corrupt_message(record: pytest.WarningsRecorder) -> str:
    """The first CheckpointCorruptWarning's text: ``pytest.warns`` records every warning of
    the block, and a file that another test left open can be collected (a ResourceWarning)
    while it runs."""
    from furcate_hydra.lightning import CheckpointCorruptWarning

    return next(str(w.message) for w in record if issubclass(w.category, CheckpointCorruptWarning))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_checkpoint_warns_and_fit_starts_from_scratch(
    damage: str, one_epoch_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import read_pointer
    from tests.lightning_helpers import run_fit, standalone_env

    checkpoint_dir = copy_of(one_epoch_dir, tmp_path)
    bad = checkpoint_dir / "epoch=0000.ckpt"
    if damage == "garbage":
        bad.write_bytes(b"not a checkpoint" * 100)
    else:
        bad.write_bytes(bad.read_bytes()[:100])

    with (
        caplog.at_level(logging.WARNING),
        pytest.warns(CheckpointCorruptWarning, match=re.escape(str(bad))) as record,
    ):
        model, result = run_fit(standalone_env(tmp_path, checkpoint_dir), max_epochs=2)

    message = corrupt_message(record)
    assert "sha256" in message and "starts from scratch" in message
    assert any(str(bad) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert model.epochs_run == [0, 1]
    assert result.resumed_from is None
    assert read_pointer(checkpoint_dir).file == "epoch=0001.ckpt"  # type: ignore[union-attr]


def test_missing_file_named_by_pointer_warns(one_epoch_dir: Path, tmp_path: Path) -> None:
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import final_checkpoint, find_resume_checkpoint

    checkpoint_dir = copy_of(one_epoch_dir, tmp_path)
    missing = checkpoint_dir / "epoch=0000.ckpt"
    missing.unlink()
    with pytest.warns(CheckpointCorruptWarning, match=re.escape(f"{missing}: last.json names it")):
        assert find_resume_checkpoint(checkpoint_dir) is None
    assert final_checkpoint(checkpoint_dir) is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "not readable JSON"),
        (b"", "not readable JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"file": "../../etc/passwd", "sha256": "00"}', "'file' must be a name"),
    ],
)
def test_bad_pointer_warns(content: bytes, why: str, one_epoch_dir: Path, tmp_path: Path) -> None:
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import (
        POINTER_NAME,
        find_resume_checkpoint,
        read_pointer,
    )

    checkpoint_dir = copy_of(one_epoch_dir, tmp_path)
    pointer = checkpoint_dir / POINTER_NAME
    pointer.write_bytes(content)
    with pytest.warns(CheckpointCorruptWarning, match=re.escape(str(pointer))) as record:
        assert find_resume_checkpoint(checkpoint_dir) is None
    assert why in corrupt_message(record)
    assert read_pointer(checkpoint_dir) is None


def test_checkpoints_without_pointer_warn(one_epoch_dir: Path, tmp_path: Path) -> None:
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import POINTER_NAME, find_resume_checkpoint

    checkpoint_dir = copy_of(one_epoch_dir, tmp_path)
    (checkpoint_dir / POINTER_NAME).unlink()
    with pytest.warns(CheckpointCorruptWarning, match=r"missing.*epoch=0000\.ckpt"):
        assert find_resume_checkpoint(checkpoint_dir) is None


def test_fresh_dir_is_silent(tmp_path: Path) -> None:
    from furcate_hydra.lightning._checkpoint import find_resume_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_resume_checkpoint(tmp_path / "never-created") is None
        (tmp_path / "empty").mkdir()
        assert find_resume_checkpoint(tmp_path / "empty") is None


def test_restart_from_scratch_never_prunes_the_pointed_file(tmp_path: Path) -> None:
    # files from an earlier, unverifiable attempt carry higher epoch numbers than the new ones
    from furcate_hydra.lightning import CheckpointCorruptWarning
    from furcate_hydra.lightning._checkpoint import find_resume_checkpoint
    from tests.lightning_helpers import run_fit, standalone_env

    checkpoint_dir = tmp_path / "checkpoints"
    checkpoint_dir.mkdir()
    stale = checkpoint_dir / "epoch=0007.ckpt"
    stale.write_bytes(b"old")
    os.utime(stale, (1_000_000, 1_000_000))
    with pytest.warns(CheckpointCorruptWarning):
        run_fit(standalone_env(tmp_path, checkpoint_dir), max_epochs=2)
    assert sorted(p.name for p in checkpoint_dir.glob("*.ckpt")) == [
        "epoch=0000.ckpt",
        "epoch=0001.ckpt",
    ]
    assert find_resume_checkpoint(checkpoint_dir) == checkpoint_dir / "epoch=0001.ckpt"


def test_keep_must_be_positive(tmp_path: Path) -> None:
    from furcate_hydra.lightning import AtomicCheckpoint

    with pytest.raises(FurcateConfigError, match=r"keep=0"):
        AtomicCheckpoint(tmp_path, keep=0)


def test_fit_keeps_the_jobs_progress_file_current(tmp_path: Path) -> None:
    from tests.lightning_helpers import BATCHES_PER_EPOCH, run_fit, standalone_env

    env = standalone_env(tmp_path)
    _, result = run_fit(env, max_epochs=2)
    progress = read_progress(env.paths.progress)
    assert progress is not None
    # written at the last epoch's end: its epoch, every step of both epochs, its metrics
    assert (progress.epoch, progress.step) == (1, 2 * BATCHES_PER_EPOCH)
    assert progress.metrics == pytest.approx(result.metrics)
