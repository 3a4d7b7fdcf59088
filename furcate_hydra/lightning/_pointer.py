"""``last.json``: the checkpoints a relaunched job can trust, newest first, each with its sha256.

    last.json = {file, sha256, epoch, global_step, saved_at, batch,      the newest checkpoint
                 previous: [{file, sha256, ...}, ...]}                   older ones still kept

A checkpoint is named here only once its file is complete, fsynced and renamed into place, and
``last.json`` itself is replaced atomically: a process killed at any moment leaves the old
pointer or the new one, each naming complete files. At resume, a named file that is missing or
does not match its hash is reported (one warning each), moved aside as ``<name>.corrupt`` and
the next older one is tried.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.layout import JobPaths

__all__ = [
    "CORRUPT_SUFFIX",
    "POINTER_NAME",
    "CheckpointCorruptWarning",
    "CheckpointEntry",
    "CheckpointPointer",
    "checkpoint_files",
    "final_checkpoint",
    "find_resume_checkpoint",
    "fsync_dir",
    "read_pointer",
    "resume_point",
    "sha256_of",
    "write_pointer",
]

log = logging.getLogger(__name__)

POINTER_NAME = JobPaths.CHECKPOINT_POINTER
CORRUPT_SUFFIX = ".corrupt"
# epoch=0003.ckpt at an epoch's end, epoch=0003-step=00000123.ckpt within epoch 3
FILE_RE = re.compile(r"^epoch=(\d+)(?:-step=(\d+))?\.ckpt$")
TMP_RE = re.compile(r"^\.epoch=\d+(?:-step=\d+)?\.ckpt\.tmp$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class CheckpointCorruptWarning(UserWarning):
    """A checkpoint or its pointer cannot be trusted: an older one is used, or none."""


@dataclass(frozen=True)
class CheckpointEntry:
    """One kept checkpoint and how to verify it.

    ``epoch`` is the epoch the checkpoint was saved in (Lightning's ``checkpoint["epoch"]``).
    ``batch`` is None when it ends that epoch (resuming continues at ``epoch + 1``), else the
    number of that epoch's batches trained (resuming continues with the next one).
    """

    file: str
    sha256: str
    epoch: int
    global_step: int
    saved_at: float
    batch: int | None = None

    @property
    def resumes_at(self) -> tuple[int, int]:
        """(epoch, batch) where training continues from this checkpoint."""
        return (self.epoch + 1, 0) if self.batch is None else (self.epoch, self.batch)


@dataclass(frozen=True)
class CheckpointPointer(CheckpointEntry):
    """The content of ``last.json``: the newest checkpoint, then the older ones kept."""

    previous: tuple[CheckpointEntry, ...] = field(default=())

    @property
    def entries(self) -> tuple[CheckpointEntry, ...]:
        newest = CheckpointEntry(**{k: v for k, v in asdict(self).items() if k != "previous"})
        return (newest, *self.previous)

    @classmethod
    def of(cls, entries: tuple[CheckpointEntry, ...]) -> CheckpointPointer:
        return cls(**asdict(entries[0]), previous=entries[1:])

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2).encode()


class _Unusable(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def write_pointer(dirpath: Path, pointer: CheckpointPointer) -> None:
    """Replace ``last.json`` in one step, durably."""
    atomic_write_bytes(dirpath / POINTER_NAME, pointer.to_json())
    fsync_dir(dirpath)


def resume_point(dirpath: Path) -> tuple[Path, CheckpointEntry] | None:
    """The newest verified checkpoint and its entry, or None to start from scratch.

    No pointer and no checkpoint means a fresh run (None, silently). A pointer that cannot be
    read, or checkpoints without one, warn with :class:`CheckpointCorruptWarning` (nothing can
    be verified). Each named file that is missing or fails its sha256 warns once, naming it, is
    moved aside and the next older one is tried; ``last.json`` then names only what is left.
    """
    dirpath = Path(dirpath)
    if not (dirpath / POINTER_NAME).exists():
        strays = sorted(p.name for p in checkpoint_files(dirpath))
        if strays:
            _warn(
                dirpath / POINTER_NAME,
                f"it is missing, so none of the checkpoints beside it ({', '.join(strays)}) "
                "can be verified",
                "The job starts from scratch (epoch 0).",
            )
        return None
    try:
        pointer = _load_pointer(dirpath)
    except _Unusable as unusable:
        _warn(unusable.path, unusable.reason, "The job starts from scratch (epoch 0).")
        return None
    entries = pointer.entries
    bad: list[tuple[Path, str]] = []
    for number, entry in enumerate(entries):
        path = dirpath / entry.file
        problem = _verify(path, entry)
        if problem is None:
            if bad:
                write_pointer(dirpath, CheckpointPointer.of(entries[number:]))
                _report(bad, f"Resuming from the older {path.name} instead.")
            return path, entry
        bad.append((path, problem))
    (dirpath / POINTER_NAME).unlink()  # it names nothing usable; the moved files stay
    fsync_dir(dirpath)
    _report(bad, "No older checkpoint is left: the job starts from scratch (epoch 0).")
    return None


def find_resume_checkpoint(dirpath: Path) -> Path | None:
    """The checkpoint :func:`resume_point` settles on, or None."""
    found = resume_point(dirpath)
    return None if found is None else found[0]


def read_pointer(dirpath: Path) -> CheckpointPointer | None:
    """The content of ``dirpath/last.json``, or None if it is absent or unreadable (no warning)."""
    try:
        return _load_pointer(Path(dirpath))
    except _Unusable:
        return None


def final_checkpoint(dirpath: Path) -> Path | None:
    """The checkpoint ``last.json`` names first, if both exist (not re-hashed)."""
    pointer = read_pointer(dirpath)
    if pointer is None:
        return None
    path = Path(dirpath) / pointer.file
    return path if path.is_file() else None


def checkpoint_files(dirpath: Path) -> list[Path]:
    if not dirpath.is_dir():
        return []
    return [p for p in dirpath.iterdir() if FILE_RE.match(p.name) and p.is_file()]


def sha256_of(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        if fsync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    # makes the renames themselves survive a power cut, not only the files' bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verify(path: Path, entry: CheckpointEntry) -> str | None:
    """Why ``path`` cannot be resumed from, or None."""
    if not path.is_file():
        return f"{POINTER_NAME} names it but it does not exist"
    try:
        digest = sha256_of(path)
    except OSError as exc:
        return f"it cannot be read ({exc})"
    if digest != entry.sha256:
        return (
            f"its sha256 is {digest}, but {POINTER_NAME} recorded {entry.sha256} "
            "(truncated or overwritten after it was saved)"
        )
    return None


def _report(bad: list[tuple[Path, str]], then: str) -> None:
    for path, problem in bad:
        if path.exists():
            aside = path.with_name(path.name + CORRUPT_SUFFIX)
            try:
                os.replace(path, aside)
                problem += f"; moved to {aside.name}"
            except OSError as exc:
                problem += f"; could not be moved aside ({exc})"
        _warn(path, problem, then)


def _warn(path: Path, reason: str, then: str) -> None:
    message = f"Cannot resume from {path}: {reason}. {then}"
    log.warning(message)
    warnings.warn(message, CheckpointCorruptWarning, stacklevel=4)


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
    previous = raw.get("previous", [])
    if not isinstance(previous, list) or not all(isinstance(e, dict) for e in previous):
        raise _Unusable(path, f"'previous' must be a list of objects, got {previous!r}")
    newest = _entry(path, raw)
    return CheckpointPointer(**asdict(newest), previous=tuple(_entry(path, e) for e in previous))


def _entry(path: Path, raw: dict[str, Any]) -> CheckpointEntry:
    file, sha, saved_at, batch = (raw.get(k) for k in ("file", "sha256", "saved_at", "batch"))
    if not isinstance(file, str) or not FILE_RE.match(file):
        raise _Unusable(path, f"'file' must be a name like 'epoch=0003.ckpt', got {file!r}")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise _Unusable(path, f"'sha256' must be 64 lowercase hex digits, got {sha!r}")
    if not isinstance(saved_at, int | float) or not math.isfinite(saved_at):
        raise _Unusable(path, f"'saved_at' must be a unix time, got {saved_at!r}")
    entry = CheckpointEntry(
        file,
        sha,
        _count(path, "epoch", raw.get("epoch")),
        _count(path, "global_step", raw.get("global_step")),
        float(saved_at),
    )
    return entry if batch is None else replace(entry, batch=_count(path, "batch", batch))


def _count(path: Path, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Unusable(path, f"{key!r} must be a non-negative integer, got {value!r}")
    return value
