"""Notice when a config file's content changes, cheaply enough to ask every second."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["FileWatcher"]


class FileWatcher:
    """``changed()`` is true once per change of the file's content.

    The stat signature (mtime, size, inode) is read on every call; the content is hashed only
    when it moved, so a ``touch`` or an editor saving the same text is not a change. A file
    that is briefly missing (editors that save by rename) is not a change either: the new
    content counts once it is there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stat = self._signature()
        self._digest = self._hash()

    def changed(self) -> bool:
        signature = self._signature()
        if signature is None or signature == self._stat:
            return False
        digest = self._hash()
        if digest is None:
            return False
        self._stat = signature
        if digest == self._digest:
            return False
        self._digest = digest
        return True

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _hash(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None
