"""The app's own ModelCheckpoint in a furcate job: its ``last.ckpt`` is where a job resumes when
it is newer than furcate's checkpoint, and a resumed job carries its state into its own dir."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def trainer_with(*callbacks: Any, rank_zero: bool = True) -> Any:
    return SimpleNamespace(checkpoint_callbacks=list(callbacks), is_global_zero=rank_zero)


def saved(path: Path, mtime: float) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 0}, path)  # a zip file, as every checkpoint torch writes
    os.utime(path, (mtime, mtime))
    return path


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_apps_last_ckpt_is_taken_only_when_newer_and_whole(
    tmp_path: Path, namespace: str
) -> None:
    import importlib

    from furcate_hydra.lightning import JobEnv
    from furcate_hydra.lightning._app_checkpoints import AppCheckpoints

    callbacks = importlib.import_module(f"{namespace}.callbacks")
    job, previous = tmp_path / "second" / "0", tmp_path / "first" / "0"
    env = JobEnv(job, job / "resume", resumed_output_dir=previous)
    app = callbacks.ModelCheckpoint(dirpath=job / "checkpoints", save_last=True)
    ours = saved(job / "resume" / "epoch=0001.ckpt", 2000)
    finder = AppCheckpoints(env)

    assert finder.newer_last(trainer_with(app), ours) is None  # none yet
    older = saved(previous / "checkpoints" / "last.ckpt", 1000)
    assert finder.newer_last(trainer_with(app), ours) is None
    os.utime(older, (3000, 3000))  # the previous attempt's, newer than furcate's
    assert finder.newer_last(trainer_with(app), ours) == older
    assert finder.newer_last(trainer_with(app), None) == older
    here = saved(job / "checkpoints" / "last.ckpt", 4000)  # this job dir's, newer still
    assert finder.newer_last(trainer_with(app), ours) == here
    here.write_bytes(b"cut short")  # not a whole checkpoint file: the other one
    assert finder.newer_last(trainer_with(app), ours) == older
    no_last = callbacks.ModelCheckpoint(dirpath=job / "checkpoints", save_last=False)
    assert finder.newer_last(trainer_with(no_last), ours) is None


def test_another_rank_points_at_the_new_dir_and_leaves_the_files_to_rank_zero(
    tmp_path: Path,
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from furcate_hydra.lightning import JobEnv
    from furcate_hydra.lightning._app_checkpoints import AppCheckpoints

    old, new = tmp_path / "first" / "0" / "checkpoints", tmp_path / "second" / "0" / "checkpoints"
    best = saved(old / "epoch_001.ckpt", 1000)
    app = ModelCheckpoint(dirpath=new, monitor="val/acc")
    state: dict[str, Any] = {"dirpath": str(old), "best_model_path": str(best)}
    carrier = AppCheckpoints(JobEnv(new.parent, new.parent / "resume"))
    checkpoint = {"callbacks": {app.state_key: state}}
    carrier.on_load_checkpoint(trainer_with(app, rank_zero=False), None, checkpoint)  # type: ignore[arg-type]
    assert state["best_model_path"] == str(new / "epoch_001.ckpt")  # as rank zero has it
    assert not new.exists()  # rank zero links the files: two ranks would race for the names


def test_a_resumed_state_is_carried_into_the_new_dir_and_the_old_files_stay(
    tmp_path: Path,
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from furcate_hydra.lightning import JobEnv
    from furcate_hydra.lightning._app_checkpoints import AppCheckpoints

    old, new = tmp_path / "first" / "0" / "checkpoints", tmp_path / "second" / "0" / "checkpoints"
    best, other = saved(old / "epoch_001.ckpt", 1000), saved(old / "epoch_000.ckpt", 900)
    app = ModelCheckpoint(dirpath=new, monitor="val/acc", save_top_k=2, save_last=True)
    state: dict[str, Any] = {
        "best_model_score": 0.9,
        "dirpath": str(old),
        "best_model_path": str(best),
        "kth_best_model_path": str(other),
        "last_model_path": str(old / "last.ckpt"),  # gone: left as it was
        "best_k_models": {str(best): 0.9, str(other): 0.8},
    }
    checkpoint = {"callbacks": {app.state_key: state}}
    carrier = AppCheckpoints(JobEnv(new.parent, new.parent / "resume"))
    carrier.on_load_checkpoint(trainer_with(app), None, checkpoint)  # type: ignore[arg-type]

    assert state["dirpath"] == str(new)
    assert state["best_model_path"] == str(new / "epoch_001.ckpt")
    assert state["kth_best_model_path"] == str(new / "epoch_000.ckpt")
    assert state["last_model_path"] == str(old / "last.ckpt")
    assert state["best_k_models"] == {
        str(new / "epoch_001.ckpt"): 0.9,
        str(new / "epoch_000.ckpt"): 0.8,
    }
    assert (new / "epoch_001.ckpt").samefile(best)  # a hard link: no space, old file intact
    app.load_state_dict(state)  # Lightning's own load then keeps every entry
    assert app.best_model_path == str(new / "epoch_001.ckpt") and len(app.best_k_models) == 2
    (new / "epoch_000.ckpt").unlink()  # the new job's top-k pruning
    assert other.is_file()
