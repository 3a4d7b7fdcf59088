"""What a job imported that its fork server had not: the installed packages it loaded itself.

A job is a fork of the server, so whatever the server has imported costs the job nothing. An app
that imports torch and Lightning inside its main function (to keep ``--help`` quick) has them
imported by every job instead, seconds each. Each job names, in its report, the top-level
packages it imported from an installed location (site-packages) in the order it imported them;
the launcher hands them to the server (``learned_imports``), and later jobs start warm. The
heavy ones it says as soon as each is in (``ImportWatch``), while it goes on: the server can
take them on while the first jobs still run, and the jobs waiting ahead start with them.

The app's own modules (beside its script, or an editable checkout) are never named: importing
them in the server would run the app's code outside a job.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Collection, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from furcate_hydra.python_dirs import library_dirs

__all__ = ["ImportWatch", "installed_imports", "notice", "said"]

# how a job's line on its done pipe says what it imported (the pipe's last byte says it is done)
NOTICE = b"i"


def installed_imports(before: Collection[str]) -> tuple[str, ...]:
    """Top-level packages in ``sys.modules`` now and not in ``before``, installed in a
    site-packages directory, in the order this process imported them."""
    dirs = library_dirs(stdlib=False)
    found = []
    for name, module in list(sys.modules.items()):  # dicts keep the order of import
        if "." in name or name.startswith("_") or name in before:
            continue
        where = _location(module)
        if where is not None and where.startswith(dirs):
            found.append(name)
    return tuple(found)


def _location(module: object) -> str | None:
    """Where a module was loaded from, resolved; None for built-in and frozen ones."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    if isinstance(origin, str) and os.path.isabs(origin):
        return os.path.realpath(origin)
    locations = list(getattr(spec, "submodule_search_locations", None) or ())
    return os.path.join(os.path.realpath(locations[0]), "") if locations else None


class ImportWatch:
    """A finder first on ``sys.meta_path`` that finds nothing: it notes when one of ``heavy``
    (top-level names the server lacks) starts importing, and, at a later import, writes the
    ones done since to ``fd`` (``notice``). Imports the server has cost it nothing."""

    def __init__(self, heavy: Collection[str], fd: int) -> None:
        self._heavy = set(heavy)
        self._fd = fd
        self._pending: list[str] = []

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if self._pending:
            self._say_done()
        if path is None and name in self._heavy:
            self._heavy.discard(name)
            self._pending.append(name)
        return None

    def _say_done(self) -> None:
        done = [name for name in self._pending if _imported(name)]
        if done:
            self._pending = [name for name in self._pending if name not in done]
            with contextlib.suppress(OSError):  # the server gone: the job goes on
                os.write(self._fd, notice(done))


def notice(names: Sequence[str]) -> bytes:
    """One line on a job's done pipe: the packages it has just imported."""
    return NOTICE + json.dumps(list(names)).encode() + b"\n"


def said(done_fd: int) -> tuple[list[list[str]], bool]:
    """Read a job's done pipe: the notices there, and whether the job is done (its last byte
    is not a line's end, or the pipe ended). Each notice is a write of its own, under the
    pipe's atomic size, so none comes cut."""
    data = b""
    with contextlib.suppress(OSError):
        data = os.read(done_fd, 65536)
    *lines, last = data.split(b"\n")
    notices = [json.loads(line[len(NOTICE) :]) for line in lines if line.startswith(NOTICE)]
    return notices, not data or bool(last)


def _imported(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)
