"""Write files so that a reader never sees half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "link_or_copy"]

# mkstemp creates 0600 files; a file written here gets the mode open() would give it.
_UMASK = os.umask(0)
os.umask(_UMASK)
_MODE = 0o666 & ~_UMASK


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, durable: bool = True, mode: int | None = None
) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it into place.

    Readers never see half a file either way; ``durable=False`` skips the fsync (a few ms) for
    reports that can be rewritten, where surviving a power cut does not matter. ``mode``: the
    file's, set before a byte is written (None: what ``open`` would give it).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _MODE if mode is None else mode)
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link_or_copy(source: Path, target: Path) -> Path:
    """``target`` as a hard link to ``source`` (a copy where links fail: another file system),
    replacing any ``target`` in one step, so a reader sees the old file or the new one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target
