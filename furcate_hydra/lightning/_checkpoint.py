"""Epoch checkpoints that a relaunched job can trust, found through a verified pointer.

Each epoch end writes ``.epoch=NNNN.ckpt.tmp``, fsyncs it, renames it to ``epoch=NNNN.ckpt`` and
only then replaces ``last.json`` (atomically) with the file's name and sha256. A process killed at
any point leaves either the previous pointer or the new one, each naming a complete file, so
``last.json`` is the single source of truth and stray files are never guessed at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Checkpoint

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.layout import JobPaths

__all__ = [
    "POINTER_NAME",
    "AtomicCheckpoint",
    "CheckpointCorruptWarning",
    "CheckpointPointer",
    "final_checkpoint",
    "find_resume_checkpoint",
    "read_pointer",
]

log = logging.getLogger(__name__)

POINTER_NAME = JobPaths.CHECKPOINT_POINTER
_FILE_RE = re.compile(r"^epoch=(\d+)\.ckpt$")
_TMP_RE = re.compile(r"^\.epoch=\d+\.ckpt\.tmp$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class CheckpointCorruptWarning(UserWarning):
    """A checkpoint or its pointer cannot be trusted, so the job starts from scratch."""


@dataclass(frozen=True)
class CheckpointPointer:
    """The content of ``last.json``: the newest complete checkpoint and how to verify it.

    ``epoch`` is the index of the epoch the checkpoint ends (Lightning's ``checkpoint["epoch"]``);
    resuming from it continues at ``epoch + 1``.
    """

    file: str
    sha256: str
    epoch: int
    global_step: int
    saved_at: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode()


class _Unusable(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class AtomicCheckpoint(Checkpoint):
    """Save a checkpoint at the end of every training epoch, never leaving a half-written one.

    It is a ``Checkpoint`` so that Lightning runs it last at epoch end: after the epoch's
    validation, after ``LightningModule.on_train_epoch_end`` and after every other callback, so the
    saved state is the epoch's final state. At that point ``trainer.current_epoch`` is still the
    finished epoch while the fit loop already counts it as processed, which is exactly what makes
    ``fit(ckpt_path=...)`` continue at the next epoch.

    Every rank calls ``trainer.save_checkpoint`` (the strategy may need all of them); only global
    rank zero renames, writes the pointer and prunes. Strategies that shard a checkpoint into a
    directory (FSDP, DeepSpeed) are not supported.

    Args:
        dirpath: Directory of the checkpoints and ``last.json``; created if missing.
        keep: How many of the newest checkpoints to keep; the one the pointer names is always kept.
    """

    def __init__(self, dirpath: Path, keep: int = 2) -> None:
        if keep < 1:
            raise FurcateConfigError(
                "keep", keep, "must be at least 1 (last.json names a kept file)", "pass keep>=1"
            )
        self.dirpath = Path(dirpath)
        self.keep = keep
        self.last_saved: Path | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a debugging run must not become the run's resume point
        fast_dev_run = trainer.fast_dev_run  # type: ignore[attr-defined]  # set outside __init__
        if fast_dev_run or trainer.sanity_checking:
            return
        self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Write the trainer's checkpoint for the current epoch and point ``last.json`` at it."""
        epoch, step = trainer.current_epoch, trainer.global_step
        name = f"epoch={epoch:04d}.ckpt"
        final = self.dirpath / name
        # the same name on every rank, in case the strategy compares or gathers paths
        tmp = self.dirpath / f".{name}.tmp"
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        # the full state (optimizers, loops, callbacks) is what resuming needs; left unset,
        # Lightning says it defaulted to that, in a log line per epoch
        trainer.save_checkpoint(tmp, weights_only=False)
        if not trainer.is_global_zero:
            return final
        digest = _sha256(tmp, fsync=True)
        os.replace(tmp, final)
        _fsync_dir(self.dirpath)
        pointer = CheckpointPointer(name, digest, epoch, step, time.time())
        atomic_write_bytes(self.dirpath / POINTER_NAME, pointer.to_json())
        _fsync_dir(self.dirpath)
        self._prune(keep_name=name)
        self.last_saved = final
        return final

    def _prune(self, keep_name: str) -> None:
        # by save time, not epoch number: after a restart from scratch, older runs' files can
        # carry higher epoch numbers than the file the pointer names
        others = [p for p in _checkpoint_files(self.dirpath) if p.name != keep_name]
        others.sort(key=lambda p: (p.stat().st_mtime_ns, _epoch_of(p)), reverse=True)
        for stale in others[self.keep - 1 :]:
            stale.unlink(missing_ok=True)
        for leftover in self.dirpath.iterdir():
            if _TMP_RE.match(leftover.name):
                leftover.unlink(missing_ok=True)


def find_resume_checkpoint(dirpath: Path) -> Path | None:
    """The verified checkpoint to resume from, or None to start from scratch.

    No pointer and no checkpoint means a fresh run (None, silently). Anything else that cannot be
    trusted (pointer unreadable, file missing, sha256 mismatch, checkpoints without a pointer)
    warns with :class:`CheckpointCorruptWarning` and logs at WARNING, naming the bad file and why.
    """
    dirpath = Path(dirpath)
    if not (dirpath / POINTER_NAME).exists():
        strays = sorted(p.name for p in _checkpoint_files(dirpath))
        if strays:
            _warn_unusable(
                dirpath / POINTER_NAME,
                f"it is missing, so none of the checkpoints beside it ({', '.join(strays)}) "
                "can be verified",
            )
        return None
    try:
        pointer = _load_pointer(dirpath)
        path = dirpath / pointer.file
        if not path.is_file():
            raise _Unusable(path, f"{POINTER_NAME} names it but it does not exist")
        try:
            digest = _sha256(path)
        except OSError as exc:
            raise _Unusable(path, f"it cannot be read ({exc})") from exc
        if digest != pointer.sha256:
            raise _Unusable(
                path,
                f"its sha256 is {digest}, but {POINTER_NAME} recorded {pointer.sha256} "
                "(truncated or overwritten after it was saved)",
            )
    except _Unusable as bad:
        _warn_unusable(bad.path, bad.reason)
        return None
    return path


def read_pointer(dirpath: Path) -> CheckpointPointer | None:
    """The content of ``dirpath/last.json``, or None if it is absent or unreadable (no warning)."""
    try:
        return _load_pointer(Path(dirpath))
    except _Unusable:
        return None


def final_checkpoint(dirpath: Path) -> Path | None:
    """The checkpoint ``last.json`` names, if both exist (not re-hashed)."""
    pointer = read_pointer(dirpath)
    if pointer is None:
        return None
    path = Path(dirpath) / pointer.file
    return path if path.is_file() else None


def _load_pointer(dirpath: Path) -> CheckpointPointer:
    path = dirpath / POINTER_NAME
    try:
        raw: Any = json.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise _Unusable(path, "it does not exist") from exc
    except (OSError, ValueError) as exc:
        raise _Unusable(path, f"it is not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise _Unusable(path, f"expected a JSON object, got {type(raw).__name__}")
    file, sha, epoch, step, saved_at = (
        raw.get(k) for k in ("file", "sha256", "epoch", "global_step", "saved_at")
    )
    if not isinstance(file, str) or not _FILE_RE.match(file):
        raise _Unusable(path, f"'file' must be a name like 'epoch=0003.ckpt', got {file!r}")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise _Unusable(path, f"'sha256' must be 64 lowercase hex digits, got {sha!r}")
    if not isinstance(saved_at, int | float) or not math.isfinite(saved_at):
        raise _Unusable(path, f"'saved_at' must be a unix time, got {saved_at!r}")
    epoch = _count(path, "epoch", epoch)
    step = _count(path, "global_step", step)
    return CheckpointPointer(file, sha, epoch, step, float(saved_at))


def _count(path: Path, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Unusable(path, f"{key!r} must be a non-negative integer, got {value!r}")
    return value


def _warn_unusable(path: Path, reason: str) -> None:
    message = f"Cannot resume from {path}: {reason}. The job starts from scratch (epoch 0)."
    log.warning(message)
    warnings.warn(message, CheckpointCorruptWarning, stacklevel=3)


def _checkpoint_files(dirpath: Path) -> list[Path]:
    if not dirpath.is_dir():
        return []
    return [p for p in dirpath.iterdir() if _FILE_RE.match(p.name) and p.is_file()]


def _epoch_of(path: Path) -> int:
    match = _FILE_RE.match(path.name)
    return int(match.group(1)) if match else -1


def _sha256(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        if fsync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    # makes the renames themselves survive a power cut, not only the files' bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
