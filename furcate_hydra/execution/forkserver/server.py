"""The warm fork server: one process that holds the heavy modules once and forks every job.

    launcher ──Init/SetContext/Start/Release/Kill/Shutdown──► server (one thread, one selector)
                                                                 │ fork()
    launcher ◄──Ready/Started/Unused/Exited/Stopped───────────── │──► job (own session, slot
                                                                 │    env, pinned)
                                                                 ◄── job stdout/stderr pipes,
                                                                     teed to its log files and
                                                                     the console

Usually a fork of the launcher itself, made before the launcher opens its store, so it starts
with the task's modules already loaded (``serve_forked``); else a fresh interpreter that imports
them (``main``). A job started without a slot is forked ahead: it waits at its gate until a
running job ends, and the server at once writes it that job's slot, before it even tells the
launcher: a slot goes from one job to the next without a round trip. A job ends when it says
so on its ``done`` pipe, with its result written and its output flushed, just before it exits
(the kernel's teardown of a process that has torch loaded takes tens of milliseconds more), or
when it exits without saying so (a crash).

The server never initialises CUDA and never runs job code itself. When the launcher goes away
(its socket closes) or the server gets SIGTERM, it stops every job's process group and exits, so
no job outlives the sweep that started it.

What jobs say they imported, the launcher hands back (``Preload``): the server imports it once
(``learned_imports``), holding forks meanwhile, then forks the jobs waiting ahead again.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import pickle
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import cloudpickle

from furcate_hydra.execution.forkserver.child import run_child
from furcate_hydra.execution.forkserver.job_imports import said
from furcate_hydra.execution.forkserver.learned_imports import ImportLearning, LearnedImports
from furcate_hydra.execution.forkserver.protocol import (
    Exited,
    Imported,
    Init,
    Kill,
    Placement,
    Preload,
    Preloaded,
    Ready,
    Release,
    SetContext,
    Shutdown,
    Start,
    Started,
    StartFailed,
    Stopped,
    Unused,
    WarmContext,
)
from furcate_hydra.execution.forkserver.tee import OutputTee
from furcate_hydra.execution.forkserver.warm_up import (
    import_preloads,
    refuse_initialised_cuda,
    use_context,
)

__all__ = ["ORPHAN_GRACE_S", "ForkServer"]

# How long a finished job's output pipes may stay open (held by an escaped grandchild) before
# the server gives up on them and reports the exit anyway.
_PIPE_DRAIN_S = 2.0
# Grace period used when the launcher disappears without asking for a shutdown.
ORPHAN_GRACE_S = 5.0


@dataclass
class _Job:
    start: Start
    pid: int
    pidfd: int | None  # until it has exited: its number is free then, and may be reused
    tees: list[OutputTee]
    placement: Placement | None  # None while forked ahead, waiting for a slot
    gate_fd: int | None = None  # the write end of its gate, while it waits
    done_fd: int | None = None  # the read end of its done pipe, until it ends
    wait_status: int | None = None
    ended_at: float = 0.0
    drain_deadline: float = 0.0
    retired: bool = False  # forked again after the server imported more: never reported


class ForkServer:
    """Owns the selector, the jobs it forked and their output pipes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.selector = selectors.EpollSelector()  # Linux only, like pidfd and affinity
        self.context: WarmContext | None = None
        self.jobs: dict[str, _Job] = {}
        self.ahead: collections.deque[_Job] = collections.deque()  # forked ahead, oldest first
        self.launcher_gone = False
        self.stop_deadline: float | None = None
        self.retired: list[_Job] = []  # forked ahead, then again warmer: until they exit
        self.held: list[Start] = []  # asked while the server imports: forked once it is done
        self.learning = ImportLearning(
            lambda fd, call: self.selector.register(fd, selectors.EVENT_READ, call),
            self.selector.unregister,
            self._owned_fds,
            self._on_learned,
        )

    # -- set-up --------------------------------------------------------------------------

    def initialise(self, init: Init) -> None:
        """A fresh interpreter: the launcher's path and directory, the preloads, the task."""
        sys.path[:] = init.sys_path
        os.chdir(init.cwd)
        began = time.perf_counter()
        preloaded = import_preloads(init.preload)
        self._set_context(init.context)
        refuse_initialised_cuda()
        self.conn.send(Ready(os.getpid(), time.perf_counter() - began, preloaded))

    def initialise_forked(self, preload: list[str], context: WarmContext) -> None:
        """A fork of the launcher: only the preloads it has not imported, and its context."""
        began = time.perf_counter()
        preloaded = import_preloads(preload)
        # no collection first: over torch's objects it takes ~0.3 s here, on the way to the
        # first job, to free a little garbage the launcher left
        self.context = use_context(context, collect=False)
        refuse_initialised_cuda()
        self.conn.send(Ready(os.getpid(), time.perf_counter() - began, preloaded))

    def _set_context(self, blob: bytes) -> None:
        self.context = use_context(cloudpickle.loads(blob), collect=True)

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
            self.request_stop(ORPHAN_GRACE_S)
            return
        if isinstance(message, Start):
            self._start(message)
        elif isinstance(message, Release):
            if self.ahead and self.stop_deadline is None:
                self._place(self.ahead.popleft(), message.placement, after=None)
            else:
                self._send(Unused(message.placement.slot))
        elif isinstance(message, SetContext):
            self._set_context(message.context)
        elif isinstance(message, Preload):
            self.learning.request(message.modules, message.probe_limit_s)
        elif isinstance(message, Kill):
            self._unhold(message.key, message.signum)
            job = self.jobs.get(message.key)
            if job is not None and job.wait_status is None:
                self._drop_ahead(job)
                _killpg(job.pid, message.signum)
        elif isinstance(message, Shutdown):
            self.request_stop(message.grace_s)

    def request_stop(self, grace_s: float) -> None:
        """Ask every job's process group to stop; SIGKILL what is left after ``grace_s``."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + grace_s
        self.learning.stop()
        for start in list(self.held):
            self._unhold(start.key, signal.SIGTERM)
        for job in self.jobs.values():
            if job.wait_status is None:
                self._drop_ahead(job)
                _killpg(job.pid, signal.SIGTERM)

    def _next_timeout(self) -> float | None:
        deadlines = [
            job.drain_deadline for job in self.jobs.values() if job.wait_status is not None
        ]
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if (probe_deadline := self.learning.deadline()) is not None:
            deadlines.append(probe_deadline)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        self.learning.check_deadline(now)
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
        if self.learning.importing:  # a fork now could copy a half-imported module
            self.held.append(start)
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
        self.context.before_fork(start.env)
        sys.stdout.flush()
        sys.stderr.flush()
        gate_read, gate_write = os.pipe() if start.placement is None else (None, None)
        done_read, done_write = os.pipe()
        inherited = self._owned_fds() + [fd for tee in tees for fd in tee.server_fds()]
        inherited += [fd for fd in (gate_write, done_read) if fd is not None]
        pid = os.fork()
        if pid == 0:
            out, err = tees[0].write_fd, tees[1].write_fd
            run_child(start, self.context, out, err, inherited, gate_read, done_write)
        started_at = time.time()
        os.close(done_write)
        pidfd = os.pidfd_open(pid)
        job = _Job(start, pid, pidfd, tees, start.placement, gate_write, done_read)
        self.jobs[start.key] = job
        for tee in tees:
            tee.close_write_end()
            self.selector.register(tee.read_fd, selectors.EVENT_READ, self._reader(job, tee))
        self.selector.register(done_read, selectors.EVENT_READ, lambda: self._on_says(job))
        self.selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_exit(job))
        if gate_read is not None:
            os.close(gate_read)
            self.ahead.append(job)
        else:
            assert start.placement is not None
            self._send(Started(start.key, pid, started_at, start.placement.slot))

    def _place(self, job: _Job, placement: Placement, after: str | None) -> None:
        """Open the gate of a job forked ahead: it runs on ``placement`` from now."""
        assert job.gate_fd is not None
        job.placement = placement
        data = pickle.dumps(placement)
        try:
            while data:
                data = data[os.write(job.gate_fd, data) :]
        except OSError:
            pass  # it died waiting: its exit is reported as any job's
        os.close(job.gate_fd)
        job.gate_fd = None
        self._send(Started(job.start.key, job.pid, time.time(), placement.slot, after))

    def _on_says(self, job: _Job) -> None:
        """Lines on the job's done pipe (what it imported), or its end."""
        assert job.done_fd is not None
        notices, done = said(job.done_fd)
        for names in notices:
            self._send(Imported(job.start.key, names))
        if done:
            self._on_done(job)

    def _on_done(self, job: _Job) -> None:
        """The job has ended (done, or exited): its slot goes to the oldest job forked ahead."""
        if job.done_fd is None:
            return
        self.selector.unregister(job.done_fd)
        os.close(job.done_fd)
        job.done_fd = None
        if job.placement is not None and self.ahead and self.stop_deadline is None:
            self._place(self.ahead.popleft(), job.placement, after=job.start.key)

    def _drop_ahead(self, job: _Job) -> None:
        """A job forked ahead that must not run: close its gate, so that it exits unstarted."""
        if job in self.ahead:
            self.ahead.remove(job)
        if job.gate_fd is not None:
            os.close(job.gate_fd)
            job.gate_fd = None

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
        assert job.pidfd is not None
        self.selector.unregister(job.pidfd)
        os.close(job.pidfd)
        # it stays a job until its output is drained: its handle must not be taken for one
        # the server still holds (a job forked meanwhile would close its own pipe by that number)
        job.pidfd = None
        self._drop_ahead(job)  # one that died waiting never had a slot
        self._on_done(job)  # one that crashed did not say it was done
        job.wait_status = status
        job.ended_at = time.time()
        job.drain_deadline = time.monotonic() + _PIPE_DRAIN_S
        self._maybe_report(job)

    def _maybe_report(self, job: _Job) -> None:
        if job.wait_status is None or not all(tee.closed for tee in job.tees):
            return
        if job.retired:
            self.retired.remove(job)
            return
        del self.jobs[job.start.key]
        self._send(Exited(job.start.key, job.wait_status, job.ended_at))

    def _owned_fds(self) -> list[int]:
        fds = [self.conn.fileno(), self.selector.fileno(), *self.learning.owned()]
        for job in [*self.jobs.values(), *self.retired]:
            fds.extend(fd for fd in (job.pidfd, job.gate_fd, job.done_fd) if fd is not None)
            for tee in job.tees:
                fds.extend(tee.server_fds())
        return fds

    # -- what the jobs import -------------------------------------------------------------

    def _on_learned(self, learned: LearnedImports) -> None:
        """A round of imports is done: what it brought in, if anything, jobs now start with."""
        if learned.grew:
            assert self.context is not None
            self.context.after_imports()
            gc.freeze()  # as after the first imports: never scanned, pages stay shared
        self._send(Preloaded(learned.imported, learned.refused, learned.seconds))
        held, self.held = self.held, []
        for start in held:
            self._start(start)
        if learned.grew and self.stop_deadline is None:
            self._fork_ahead_again()

    def _fork_ahead_again(self) -> None:
        """Jobs waiting ahead were forked before the server imported what they need, and would
        each import it again: fork them again (Hydra's set-up, milliseconds), in order."""
        for job in list(self.ahead):
            self._drop_ahead(job)  # its gate closes: it exits without having run
            job.retired = True
            self.retired.append(job)
            del self.jobs[job.start.key]
            self._start(job.start)

    def _unhold(self, key: str, signum: int) -> None:
        """A job held for the imports is stopped before its fork: it ends as if killed."""
        for start in [s for s in self.held if s.key == key]:
            self.held.remove(start)
            self._send(Exited(key, signum, time.time()))

    def _send(self, message: object) -> None:
        if self.launcher_gone:
            return
        try:
            self.conn.send(message)
        except OSError:
            self.launcher_gone = True
            self.request_stop(ORPHAN_GRACE_S)


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
