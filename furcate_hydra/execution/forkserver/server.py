"""The warm fork server: one process that imports the heavy modules once and forks every job.

    launcher ──Init/SetContext/Start/Kill/Shutdown──► server (single thread, one selector)
                                                         │ fork()
    launcher ◄──Ready/Started/Exited/Stopped──────────── │──► job (own session, slot env, pinned)
                                                         ◄── job stdout/stderr pipes, teed to
                                                             the job's log files and the console

The server never initialises CUDA and never runs job code itself. When the launcher goes away
(its socket closes) or the server gets SIGTERM, it stops every job's process group and exits, so
no job outlives the sweep that started it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import os
import selectors
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from furcate_hydra.execution.forkserver.child import run_child
from furcate_hydra.execution.forkserver.protocol import (
    Exited,
    Init,
    InitFailed,
    Kill,
    Ready,
    SetContext,
    Shutdown,
    Start,
    Started,
    StartFailed,
    Stopped,
    WarmContext,
)
from furcate_hydra.execution.forkserver.tee import OutputTee

__all__ = ["main"]

# How long a finished job's output pipes may stay open (held by an escaped grandchild) before
# the server gives up on them and reports the exit anyway.
_PIPE_DRAIN_S = 2.0
# Grace period used when the launcher disappears without asking for a shutdown.
_ORPHAN_GRACE_S = 5.0


@dataclass
class _Job:
    start: Start
    pid: int
    pidfd: int
    tees: list[OutputTee]
    wait_status: int | None = None
    ended_at: float = 0.0
    drain_deadline: float = 0.0


class ForkServer:
    """Owns the selector, the jobs it forked and their output pipes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.selector = selectors.EpollSelector()  # Linux only, like pidfd and affinity
        self.context: WarmContext | None = None
        self.jobs: dict[str, _Job] = {}
        self.launcher_gone = False
        self.stop_deadline: float | None = None

    # -- set-up --------------------------------------------------------------------------

    def initialise(self, init: Init) -> None:
        sys.path[:] = init.sys_path
        os.chdir(init.cwd)
        began = time.perf_counter()
        preloaded = [name for name in init.preload if _import_if_installed(name)]
        self._set_context(init.context)
        _refuse_initialised_cuda()
        self.conn.send(Ready(os.getpid(), time.perf_counter() - began, preloaded))

    def _set_context(self, blob: bytes) -> None:
        context: WarmContext = cloudpickle.loads(blob)
        context.prepare()
        self.context = context
        # torch and Lightning leave ~400k objects behind. Frozen, they are never scanned again:
        # a job's first full collection no longer walks them (200+ ms), and no collection
        # touches their pages, so they stay shared with the server instead of being copied.
        gc.collect()
        gc.freeze()

    # -- main loop -----------------------------------------------------------------------

    def serve(self) -> None:
        self.selector.register(self.conn.fileno(), selectors.EVENT_READ, "conn")
        while not (self.stop_deadline is not None and not self.jobs):
            for key, _ in self.selector.select(timeout=self._next_timeout()):
                if key.data == "conn":
                    self._on_message()
                else:
                    key.data()
            self._check_deadlines()
        if not self.launcher_gone:
            self.conn.send(Stopped())

    def _on_message(self) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self.launcher_gone = True
            self.selector.unregister(self.conn.fileno())
            self.request_stop(_ORPHAN_GRACE_S)
            return
        if isinstance(message, Start):
            self._start(message)
        elif isinstance(message, SetContext):
            self._set_context(message.context)
        elif isinstance(message, Kill):
            job = self.jobs.get(message.key)
            if job is not None and job.wait_status is None:
                _killpg(job.pid, message.signum)
        elif isinstance(message, Shutdown):
            self.request_stop(message.grace_s)

    def request_stop(self, grace_s: float) -> None:
        """Ask every job's process group to stop; SIGKILL what is left after ``grace_s``."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + grace_s
        for job in self.jobs.values():
            if job.wait_status is None:
                _killpg(job.pid, signal.SIGTERM)

    def _next_timeout(self) -> float | None:
        deadlines = [
            job.drain_deadline for job in self.jobs.values() if job.wait_status is not None
        ]
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        if self.stop_deadline is not None and now >= self.stop_deadline:
            for job in self.jobs.values():
                if job.wait_status is None:
                    _killpg(job.pid, signal.SIGKILL)
        for job in list(self.jobs.values()):
            if job.wait_status is not None and now >= job.drain_deadline:
                for tee in job.tees:
                    self._close_tee(tee)
                self._maybe_report(job)

    # -- jobs ----------------------------------------------------------------------------

    def _start(self, start: Start) -> None:
        if self.stop_deadline is not None or self.context is None:
            self._send(StartFailed(start.key, "the fork server is stopping"))
            return
        try:
            os.makedirs(os.path.dirname(start.stdout_path), exist_ok=True)
            tees = [
                OutputTee(start.stdout_path, sys.stdout.buffer if start.echo else None),
                OutputTee(start.stderr_path, sys.stderr.buffer if start.echo else None),
            ]
        except OSError as exc:
            self._send(StartFailed(start.key, f"cannot open the job's log files: {exc}"))
            return
        sys.stdout.flush()
        sys.stderr.flush()
        inherited = self._owned_fds() + [fd for tee in tees for fd in tee.server_fds()]
        pid = os.fork()
        if pid == 0:
            run_child(start, self.context, tees[0].write_fd, tees[1].write_fd, inherited)
        forked_at = time.time()
        pidfd = os.pidfd_open(pid)
        job = _Job(start, pid, pidfd, tees)
        self.jobs[start.key] = job
        for tee in tees:
            tee.close_write_end()
            self.selector.register(tee.read_fd, selectors.EVENT_READ, self._reader(job, tee))
        self.selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_exit(job))
        self._send(Started(start.key, pid, forked_at))

    def _reader(self, job: _Job, tee: OutputTee) -> Callable[[], None]:
        def read() -> None:
            if not tee.pump():
                self._close_tee(tee)
                self._maybe_report(job)

        return read

    def _close_tee(self, tee: OutputTee) -> None:
        if not tee.closed:
            self.selector.unregister(tee.read_fd)
            tee.close()

    def _on_exit(self, job: _Job) -> None:
        # The exited child is a zombie until waitpid, so its pid (= its process group id) cannot
        # have been reused: kill the group's leftovers (DataLoader workers) before reaping.
        _killpg(job.pid, signal.SIGKILL)
        _, status = os.waitpid(job.pid, 0)
        self.selector.unregister(job.pidfd)
        os.close(job.pidfd)
        job.wait_status = status
        job.ended_at = time.time()
        job.drain_deadline = time.monotonic() + _PIPE_DRAIN_S
        self._maybe_report(job)

    def _maybe_report(self, job: _Job) -> None:
        if job.wait_status is None or not all(tee.closed for tee in job.tees):
            return
        del self.jobs[job.start.key]
        self._send(Exited(job.start.key, job.wait_status, job.ended_at))

    def _owned_fds(self) -> list[int]:
        fds = [self.conn.fileno(), self.selector.fileno()]
        for job in self.jobs.values():
            fds.append(job.pidfd)
            for tee in job.tees:
                fds.extend(tee.server_fds())
        return fds

    def _send(self, message: object) -> None:
        if self.launcher_gone:
            return
        try:
            self.conn.send(message)
        except OSError:
            self.launcher_gone = True
            self.request_stop(_ORPHAN_GRACE_S)


def _import_if_installed(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    importlib.import_module(name)
    return True


def _refuse_initialised_cuda() -> None:
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialised while loading the task into the fork server; forked jobs "
            "could not use their GPU. Fix: do not touch CUDA (e.g. torch.cuda.* or .cuda()) "
            "at import time of the task's module."
        )


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def main(argv: list[str]) -> int:
    """Entry point: ``python -m furcate_hydra.execution.forkserver.server <socket fd>``."""
    conn = Connection(int(argv[1]))
    # The launcher owns the terminal's Ctrl-C, and a scheduler's SIGUSR1, and decides when
    # jobs stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    server = ForkServer(conn)
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop(_ORPHAN_GRACE_S))
    try:
        message = conn.recv()
        if not isinstance(message, Init):
            raise RuntimeError(f"expected Init as the first message, got {type(message).__name__}")
        server.initialise(message)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the launcher went away during the warm-up (a Ctrl-C): nothing to report
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(InitFailed(traceback.format_exc()))
        return 1
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
