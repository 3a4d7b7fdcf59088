"""Copy a job's output pipe into its log file and, line by line, onto the console."""

from __future__ import annotations

import os
from typing import BinaryIO

__all__ = ["OutputTee"]

_CHUNK = 65536


class OutputTee:
    """One pipe: the job writes its end, the server pumps the other into a file and the console.

    The file gets every byte as it arrives, so a crash loses nothing already written. The console
    gets whole lines only, so concurrent jobs never interleave inside a line.
    """

    def __init__(self, path: str, console: BinaryIO | None) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the job
        self._console = console
        self._partial = b""
        self.closed = False

    def close_write_end(self) -> None:
        os.close(self.write_fd)

    def server_fds(self) -> list[int]:
        """Descriptors only the server should hold (a forked job closes them)."""
        return [] if self.closed else [self.read_fd, self._file.fileno()]

    def pump(self) -> bool:
        """Move what is readable now; False at end-of-file."""
        data = os.read(self.read_fd, _CHUNK)
        if not data:
            return False
        self._file.write(data)
        if self._console is not None:
            lines, _, self._partial = (self._partial + data).rpartition(b"\n")
            if lines:
                self._echo(lines + b"\n")
        return True

    def _echo(self, data: bytes) -> None:
        assert self._console is not None
        try:
            self._console.write(data)
            self._console.flush()
        except (OSError, ValueError):
            # A closed console must not stop the log file from being written.
            self._console = None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._console is not None and self._partial:
            self._echo(self._partial + b"\n")
        self._file.close()
        os.close(self.read_fd)
