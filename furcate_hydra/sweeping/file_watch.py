"""Notice when a config file's content changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["FileWatcher"]


class FileWatcher:
    """``changed()`` is true once per change of the file's content.

    The content is hashed on every call: config files are small, and file timestamps tick
    too coarsely (a few ms) to tell two quick saves of the same size apart. A ``touch`` or
    an editor saving the same text is not a change. A file that is briefly missing (editors
    that save by rename) is not a change either: the new content counts once it is there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._digest = self._hash()

    def changed(self) -> bool:
        digest = self._hash()
        if digest is None or digest == self._digest:
            return False
        self._digest = digest
        return True

    def _hash(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None
