"""The fork server learns what its jobs import, and imports it once for every later job.

    launcher ──Preload(names the jobs reported)──► server
        well-known packages (torch, Lightning, MLflow, ...) ─────────────┐
        others ──► probe: a fork of the server, output to /dev/null,      │
                   imports each in turn:                                  │
                     failed / left a Python thread or CUDA initialised    │
                     ──► refused, with why                                │
                     not done in its limit, or the probe crashed ──►      │
                     refused; a new probe goes on with the next ones      │
                     imported ────────────────────────────────────────────┤
                                                                          ▼
        import thread in the server: forks wait for it (a fork while another thread imports
        could inherit a half-imported module); placing jobs forked ahead, their output and
        their exits go on meanwhile ──► done ──► Preloaded ──► launcher

An import that fails, hangs or takes minutes only ever does so in the probe, which is killed
at its limit: the server never waits on it. A well-known package is imported without a probe
(the job has just imported it, and it is known to import cleanly); if it fails anyway, its
error is reported and the server goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WELL_KNOWN", "ImportLearning", "LearnedImports"]

# Packages known to import cleanly in a fork server (no Python thread, no CUDA): the heavy
# ones of this project's users. The server imports them with no probe first.
WELL_KNOWN = (
    *("torch", "torchvision", "torchaudio", "torchtext", "torchmetrics"),
    *("lightning", "pytorch_lightning", "lightning_fabric", "mlflow"),
    *("numpy", "pandas", "scipy", "sklearn", "transformers", "datasets", "timm"),
)


@dataclass
class LearnedImports:
    """What one round of learning ended with (sent to the launcher as ``Preloaded``)."""

    imported: list[str] = field(default_factory=list)  # asked, and in the server now
    refused: dict[str, str] = field(default_factory=dict)  # name -> why not
    seconds: float = 0.0  # the server's own import time
    grew: bool = False  # it imported one it lacked: jobs forked before lack it


class ImportLearning:
    """The server's side: probes and the import thread, driven from its selector loop.

    ``register(fd, callback)``/``unregister(fd)``: the server's selector. ``owned_fds``: what a
    probe must close (the server's socket, its jobs' pipes and gates). ``done``: called in the
    server's thread with each round's result, once its imports are in.
    """

    def __init__(
        self,
        register: Callable[[int, Callable[[], None]], object],
        unregister: Callable[[int], object],
        owned_fds: Callable[[], list[int]],
        done: Callable[[LearnedImports], None],
    ) -> None:
        self._register = register
        self._unregister = unregister
        self._owned_fds = owned_fds
        self._done = done
        self._waiting: list[str] = []  # asked while a probe or the thread was busy
        self._limit_s = 0.0  # the probe's, as last asked
        self._tried: set[str] = set()
        self._probe: _Probe | None = None
        self._thread: _ImportThread | None = None
        self._round = LearnedImports()
        self._probed: list[str] = []  # this round's modules that a probe imported cleanly
        self._asked: list[str] = []  # this round's
        self._missing: list[str] = []  # this round's the server lacked when it began
        self._stopped = False

    @property
    def importing(self) -> bool:
        """A thread of the server imports now: nothing may be forked until it is done."""
        return self._thread is not None

    def request(self, names: Sequence[str], probe_limit_s: float) -> None:
        """Learn ``names`` (packages a job imported): those the server lacks and never tried;
        what is not known to import cleanly is tried in a probe, each for ``probe_limit_s`` at
        most (one not imported by then, the server never imports)."""
        self._limit_s = probe_limit_s
        self._waiting += [n for n in names if n not in self._tried and n not in self._waiting]
        self._next()

    def deadline(self) -> float | None:
        return None if self._probe is None else self._probe.deadline

    def check_deadline(self, now: float) -> None:
        if self._probe is not None and now >= self._probe.deadline:
            self._end_probe(timed_out=True)

    def stop(self) -> None:
        """The server is stopping: a probe is killed, nothing more is tried; a running import
        is left to end."""
        self._stopped = True
        if self._probe is not None:
            self._probe.kill()

    def owned(self) -> list[int]:
        """Descriptors of its own that a process the server forks must close."""
        fds = [] if self._probe is None else [self._probe.read_fd]
        return fds + ([] if self._thread is None else [self._thread.read_fd])

    # -- the steps -------------------------------------------------------------------------

    def _next(self) -> None:
        if self._probe or self._thread or not self._waiting or self._stopped:
            return
        self._asked = self._waiting
        names = self._missing = [n for n in self._asked if n not in sys.modules]
        self._tried.update(self._asked)
        self._waiting = []
        self._round = LearnedImports()
        self._probed = []
        known = [n for n in names if _well_known(n)]
        unknown = [n for n in names if not _well_known(n)]
        if known:  # first: they import most of the others on their way
            self._start_thread(known, then_probe=unknown)
        elif unknown:
            self._start_probe(unknown)
        else:  # in already (on the way of an earlier one): said as such
            self._finish()

    def _start_probe(self, names: list[str]) -> None:
        self._probe = _Probe.fork(names, self._owned_fds() + self.owned(), self._limit_s)
        self._register(self._probe.read_fd, self._on_probe_output)

    def _on_probe_output(self) -> None:
        assert self._probe is not None
        if not self._probe.read():
            self._end_probe(timed_out=False)

    def _end_probe(self, timed_out: bool) -> None:
        probe, self._probe = self._probe, None
        assert probe is not None
        self._unregister(probe.read_fd)
        probe.kill()
        probe.close()
        unanswered = [name for name in probe.names if name not in probe.results]
        if unanswered:  # the probe was on this one: it hung, or took the process down
            probe.results[unanswered[0]] = (
                f"its import was not done within {probe.limit_s:g} s"
                if timed_out
                else "the probe importing it ended before it did (a crash)"
            )
        self._round.refused.update({n: why for n, why in probe.results.items() if why})
        self._probed += [n for n, why in probe.results.items() if why is None]
        if unanswered[1:] and not self._stopped:  # the ones after it: in a new probe
            self._start_probe(unanswered[1:])
            return
        good = [name for name in self._probed if name not in sys.modules]
        if good and not self._stopped:
            self._start_thread(good, then_probe=[])
        else:
            self._finish()

    def _start_thread(self, names: list[str], then_probe: list[str]) -> None:
        self._thread = _ImportThread(names, then_probe)
        self._register(self._thread.read_fd, self._on_thread_done)
        self._thread.start()

    def _on_thread_done(self) -> None:
        thread, self._thread = self._thread, None
        assert thread is not None
        self._unregister(thread.read_fd)
        thread.join()
        self._round.refused.update(thread.refused)
        self._round.seconds += thread.seconds
        probe = [n for n in thread.then_probe if n not in sys.modules]
        if probe and not self._stopped:
            self._start_probe(probe)
        else:
            self._finish()

    def _finish(self) -> None:
        round_, self._round = self._round, LearnedImports()
        # what was asked and is in now, whoever imported it (one may bring in another)
        round_.imported = [name for name in self._asked if name in sys.modules]
        round_.grew = any(name in sys.modules for name in self._missing)
        self._done(round_)
        self._next()


class _ImportThread(threading.Thread):
    """Imports ``names`` in the server, in order; tells the selector through a pipe when done."""

    def __init__(self, names: list[str], then_probe: list[str]) -> None:
        super().__init__(name="furcate-preload", daemon=True)
        self.names = names
        self.then_probe = then_probe
        self.refused: dict[str, str] = {}
        self.seconds = 0.0
        self.read_fd, self._write_fd = os.pipe()

    def run(self) -> None:
        began = time.perf_counter()
        try:
            for name in self.names:
                if name in sys.modules:
                    continue
                try:
                    importlib.import_module(name)
                except BaseException:  # reported, never fatal
                    self.refused[name] = _last_line(traceback.format_exc())
        finally:
            self.seconds = time.perf_counter() - began
            os.write(self._write_fd, b"d")
            os.close(self._write_fd)

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        os.close(self.read_fd)


class _Probe:
    """A fork of the server that imports the names it was given, one JSON line a name."""

    def __init__(self, pid: int, read_fd: int, names: list[str], limit_s: float) -> None:
        self.pid = pid
        self.read_fd = read_fd
        self.names = names
        self.limit_s = limit_s
        self.deadline = time.monotonic() + limit_s
        self.results: dict[str, str | None] = {}  # name -> None, or why it was refused
        self._partial = b""
        self._reaped = False

    @classmethod
    def fork(cls, names: list[str], close_in_child: Iterable[int], limit_s: float) -> _Probe:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            _probe(names, write_fd, [*close_in_child, read_fd])
        os.close(write_fd)
        return cls(pid, read_fd, names, limit_s)

    def read(self) -> bool:
        """Take what the probe wrote; False at its end."""
        try:
            chunk = os.read(self.read_fd, 65536)
        except OSError:
            chunk = b""
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            entry = json.loads(line)
            self.results[entry["name"]] = entry["error"]
        return bool(chunk)

    def kill(self) -> None:
        if not self._reaped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self._reaped = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.read_fd)


def _probe(names: list[str], write_fd: int, close: Iterable[int]) -> None:
    """In the probe's process: import each name, say how it went, exit (never return)."""
    code = 1
    try:
        os.setsid()  # killed as a group: whatever an import started goes with it
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # what an import prints is not the sweep's output
            os.dup2(devnull, fd)
        for name in names:
            os.write(write_fd, (json.dumps({"name": name, "error": _try(name)}) + "\n").encode())
        code = 0
    finally:
        os._exit(code)


def _try(name: str) -> str | None:
    """Why ``name`` must not be imported in the fork server, or None."""
    try:
        importlib.import_module(name)
    except BaseException:  # the reason is the answer
        return _last_line(traceback.format_exc())
    if threading.active_count() > 1:
        return "its import starts a Python thread (a fork server forks from one thread only)"
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "its import initialises CUDA (jobs forked after it could not use their GPU)"
    return None


def _well_known(name: str) -> bool:
    # furcate's own job side (its Lightning layer) is known too
    return name in WELL_KNOWN or name.startswith("furcate_hydra.")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "failed"
