"""The app's own ``ModelCheckpoint`` callbacks, carried into a resumed job's own job dir.

    rerun of an interrupted run: new job dir, the app's dirpath (``<job dir>/checkpoints``)
    empty when Lightning sets it up (so no "exists and is not empty" warning)
      resume: the app's last.ckpt of the previous attempt, where newer than furcate's
      restore (on_load_checkpoint, before the callbacks load their state): each file the
              saved ModelCheckpoint state names in the old dir is hard-linked into the new one
              and the state's paths rewritten, so best_model_path, top-k and last.ckpt
              continue in the new dir; the old sweep's files stay as they were

A job re-queued in the same job dir (a preemption) finds its files where they were.

Where this process's fit trained none of the epochs that write them (a fused member, trained by
its group; a job resumed from its last epoch's checkpoint with nothing left to train), the
files are saved as the app's own run saved them at its last epoch's end
(``save_app_checkpoints``).
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from furcate_hydra.atomic import link_or_copy
from furcate_hydra.fusion.lineage import LIGHTNING, derives_from
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._namespace import CallbackBase

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["AppCheckpoints", "save_app_checkpoints"]

log = logging.getLogger(__name__)

# the ModelCheckpoint state entries that name files
_PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


class AppCheckpoints(CallbackBase):
    """Finds the app's newer ``last.ckpt`` and moves its checkpoint state into this job dir."""

    def __init__(self, env: JobEnv) -> None:
        self.env = env
        self.carried: list[Path] = []  # files linked in from the previous attempt

    def newer_last(self, trainer: pl.Trainer, ours: Path | None) -> Path | None:
        """The app's ``last.ckpt`` (this job dir's, or the previous attempt's) when it is newer
        than ``ours`` and a whole checkpoint file; else None."""
        newest: tuple[float, Path] | None = None
        for callback in _model_checkpoints(trainer):
            if not callback.save_last or callback.dirpath is None:
                continue
            name = f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
            for folder in self._folders(Path(callback.dirpath)):
                path = folder / name
                if path.is_file() and zipfile.is_zipfile(path):  # torch.save writes a zip
                    stamp = path.stat().st_mtime
                    if newest is None or stamp > newest[0]:
                        newest = (stamp, path)
        if newest is None or (ours is not None and ours.stat().st_mtime >= newest[0]):
            return None
        return newest[1]

    def _folders(self, dirpath: Path) -> list[Path]:
        """``dirpath``, and where it was in the previous attempt's job dir."""
        folders = [dirpath]
        previous = self.env.resumed_output_dir
        relative = _relative(dirpath, self.env.output_dir)
        if previous is not None and relative is not None:
            folders.append(previous / relative)
        return folders

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint.get("callbacks") or {}
        for callback in _model_checkpoints(trainer):
            state = states.get(callback.state_key)
            if not isinstance(state, dict) or callback.dirpath is None:
                continue
            old, new = state.get("dirpath"), str(callback.dirpath)
            if old and old != new:
                self._carry(state, Path(old), Path(new), trainer.is_global_zero)

    def _carry(self, state: dict[str, Any], old: Path, new: Path, files: bool) -> None:
        """Point ``state``'s paths from ``old`` to ``new``; ``files``: also link the files
        there (one rank of a distributed job: the others would race it for the same names)."""

        def moved(path: Any) -> Any:
            relative = _relative(Path(path), old) if path else None
            if relative is None or not (old / relative).is_file():
                return path
            target = new / relative
            if files and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(old / relative, target)
                self.carried.append(target)
            return str(target)

        for key in _PATH_KEYS:
            if key in state:
                state[key] = moved(state[key])
        if isinstance(state.get("best_k_models"), dict):
            state["best_k_models"] = {moved(k): v for k, v in state["best_k_models"].items()}
        state["dirpath"] = str(new)
        log.info("furcate: the app's checkpoints of %s continue in %s", old, new)


def _model_checkpoints(trainer: pl.Trainer) -> list[Any]:
    """The Trainer's checkpoint callbacks that are ModelCheckpoints (by what they have)."""
    return [
        cb
        for cb in trainer.checkpoint_callbacks
        if hasattr(cb, "best_model_path") and hasattr(cb, "CHECKPOINT_NAME_LAST")
    ]


def _relative(path: Path, folder: Path) -> Path | None:
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return None


def save_app_checkpoints(trainer: Any) -> None:
    """The files the app's own ``ModelCheckpoint`` callbacks that saved nothing yet hold at
    the end of its own run, saved as at its last epoch's end (a fused member is let into a
    group only where that end decides them: no monitor, the latest epoch kept)."""
    unsaved = [
        cb
        for cb in trainer.callbacks
        if derives_from(cb, "ModelCheckpoint", LIGHTNING)
        and not (cb.last_model_path or cb.best_model_path)
    ]
    if not unsaved:
        return
    progress = trainer.fit_loop.epoch_progress.current
    completed = progress.completed
    # inside its last epoch's end, where the app's run saved them, that epoch is not completed
    progress.completed = max(completed - 1, 0)
    try:
        for callback in unsaved:
            candidates = callback._monitor_candidates(trainer)
            callback._save_topk_checkpoint(trainer, candidates)
            callback._save_last_checkpoint(trainer, candidates)
    finally:
        progress.completed = completed
