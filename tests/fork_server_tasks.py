"""Warm contexts for tests that drive the fork server through its own protocol."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

# descriptors the server holds for the test, by name (the server's own process)
_HELD: dict[str, int] = {}


class DetachingContext:
    """Each job leaves a process of another session holding its stdout and stderr open for
    ``hold_s`` after the job has exited (a daemon the job started, say), then returns its
    payload as text.

    In the server, ``prepare`` opens a descriptor named ``hold`` and keeps it, or closes the
    one named ``release``: what a launcher's object the server inherited does when it is
    collected there, leaving a free number below the jobs' own."""

    def __init__(self, hold_s: float, hold: str | None = None, release: str | None = None):
        self.hold_s = hold_s
        self.hold = hold
        self.release = release

    def prepare(self) -> None:
        if self.hold is not None:
            _HELD[self.hold] = os.open(os.devnull, os.O_RDONLY)
        if self.release is not None:
            os.close(_HELD.pop(self.release))

    def after_imports(self) -> None:
        pass

    def before_fork(self, env: Mapping[str, str]) -> None:
        pass  # nothing to warm: each job's work is its own

    def run(self, payload: bytes, gate: Callable[[], None]) -> str:
        gate()
        code = f"import time; time.sleep({self.hold_s})"
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        return payload.decode()


class WarmingContext:
    """Before each job is forked, the server notes the job's ``WARM`` variable; each job
    returns what the server had noted by then, which it inherited."""

    def __init__(self) -> None:
        self.noted: list[str] = []

    def prepare(self) -> None:
        pass  # everything it keeps comes from before_fork

    def after_imports(self) -> None:
        pass

    def before_fork(self, env: Mapping[str, str]) -> None:
        self.noted.append(env.get("WARM", "-"))

    def run(self, payload: bytes, gate: Callable[[], None]) -> str:
        gate()
        return ",".join(self.noted)


class ImportsContext:
    """Each job returns which of the module names in its payload (JSON: ``check``, a list)
    were in ``sys.modules`` when its own code began: those it inherited from the server. It
    then imports the last one, as a task importing inside its main function does, and holds
    ``hold_s`` seconds; ``after`` counts the server's calls of ``after_imports``, which a job
    inherits."""

    def __init__(self) -> None:
        self.after = 0

    def prepare(self) -> None:
        pass

    def after_imports(self) -> None:
        self.after += 1

    def before_fork(self, env: Mapping[str, str]) -> None:
        pass

    def run(self, payload: bytes, gate: Callable[[], None]) -> tuple[list[str], int]:
        gate()
        asked = json.loads(payload)
        names = asked["check"]
        found = [name for name in names if name in sys.modules]
        if names:
            importlib.import_module(names[-1])
            importlib.import_module("json.tool")  # a later import: the watch speaks then
        time.sleep(asked.get("hold_s", 0))
        return found, self.after
