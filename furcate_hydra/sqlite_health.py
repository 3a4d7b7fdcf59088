"""Is a sqlite file sound? Checked before a sweep writes into its MLflow or Optuna store.

    sqlite_damage(path) ──► None           absent, empty (sqlite makes a new database there),
                                           sound, or busy past the timeout (not known damaged)
                        ──► SqliteDamage   not a database: no sqlite header (garbage, cut short)
                                           damaged pages: ``PRAGMA quick_check`` reports a problem

Left alone, a file that is no database ends the sweep in a long SQLAlchemy traceback, and one
with damaged pages is not noticed at all: the sweep writes into it and spreads the damage.
``quick_check`` reads every page once (O(size of the file); see BENCHMARKS.md for its cost
on a store of 10,000 runs). It checks each b-tree page, the freelist and the overflow chains,
but not that indexes match their tables (``PRAGMA integrity_check`` does, at a higher cost).

The file is opened read-only, so checking writes nothing into it, not even a WAL checkpoint.
"""

from __future__ import annotations

import shlex
import sqlite3
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SqliteDamage", "sqlite_damage"]

HEADER = b"SQLite format 3\x00"
HEADER_SIZE = 100  # the database header on page 1
# How long to wait for another process's write lock (a store shared by running sweeps).
BUSY_TIMEOUT_S = 30.0
# sqlite's result codes for "this is not what a database file looks like".
_DAMAGE_CODES = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_MAX_DETAIL = 200  # characters of sqlite's report kept in the one-line message


@dataclass(frozen=True)
class SqliteDamage:
    """What is wrong with a sqlite file, and whether sqlite can still read parts of it."""

    problem: str
    readable: bool  # a database with damaged pages: ``.recover`` may save what is left

    def fix(self, path: Path) -> str:
        """How to get a sound file back, naming ``path``."""
        if not self.readable:
            return (
                f"restore {path} from a copy, or move it away to start a new, empty store "
                "in its place"
            )
        recovered = path.with_name(f"{path.stem}-recovered{path.suffix}")
        command = (
            f"sqlite3 {shlex.quote(str(path))} .recover | sqlite3 {shlex.quote(str(recovered))}"
        )
        return (
            f"restore {path} from a copy, or save what sqlite can still read into a new file "
            f"with sqlite's .recover (`{command}`) and use that file instead"
        )


def sqlite_damage(path: Path) -> SqliteDamage | None:
    """The damage of the sqlite file at ``path``, or None when it is absent, empty or sound.

    A lock held by another process longer than ``BUSY_TIMEOUT_S`` counts as sound: that is
    not damage, and the store's own client reports it if it lasts.
    """
    try:
        with path.open("rb") as file:
            header = file.read(HEADER_SIZE)
    except OSError:  # absent; or a folder, unreadable: the store's own client says so
        return None
    if not header:
        return None
    if not HEADER.startswith(header[: len(HEADER)]):
        return SqliteDamage(
            f"the file {path} is not a sqlite database (it does not begin with sqlite's "
            f"header {HEADER[:-1].decode()!r}{_shown(header[: len(HEADER)])})",
            readable=False,
        )
    if len(header) < HEADER_SIZE:
        return SqliteDamage(
            f"the file {path} is cut short: {len(header)} bytes, less than sqlite's "
            f"{HEADER_SIZE}-byte header",
            readable=False,
        )
    try:
        problem = _quick_check(path)
    except sqlite3.Error as exc:
        if not _is_damage(exc):
            return None  # busy, unreadable...: not known to be damaged; the client reports it
        problem = str(exc)
    if problem is None:
        return None
    what = "damaged"
    size, declared = path.stat().st_size, _declared_size(header)
    if declared is not None and size < declared:
        what = f"cut short ({size} bytes of the {declared} its header counts)"
    return SqliteDamage(
        f"the sqlite file {path} is {what}: PRAGMA quick_check reports {_one_line(problem)!r}",
        readable=True,
    )


def _quick_check(path: Path) -> str | None:
    """sqlite's first complaint about the file, or None when ``quick_check`` finds none."""
    uri = f"{path.absolute().as_uri()}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        # (1): stop at the first problem; one is enough to refuse the file
        rows = connection.execute("PRAGMA quick_check(1)").fetchall()
    finally:
        connection.close()
    first = str(rows[0][0]) if rows else "no answer"
    return None if first == "ok" else first


def _is_damage(error: sqlite3.Error) -> bool:
    name = getattr(error, "sqlite_errorname", None)  # Python 3.11+
    if name is not None:
        return name in _DAMAGE_CODES
    # Python 3.10 raises the base class for these two codes, a subclass for the others
    return type(error) is sqlite3.DatabaseError


def _declared_size(header: bytes) -> int | None:
    """The file size the header declares, where sqlite trusts that figure (the file format's
    "in-header database size", valid when the change counter matches version-valid-for)."""
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big")
    if not pages or header[24:28] != header[92:96]:
        return None
    return (65536 if page_size == 1 else page_size) * pages


def _shown(start: bytes) -> str:
    """What the file begins with instead, when that is text (an HTML page, an LFS pointer)."""
    printable = all(0x20 <= byte < 0x7F for byte in start)
    return f", but with {start.decode('ascii')!r}" if printable else ""


def _one_line(text: str) -> str:
    line = " ".join(text.replace("*** in database main ***", "").split())
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 3] + "..."
