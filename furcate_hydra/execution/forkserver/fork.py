"""Start the fork server as a fork of the launcher, or as a fresh interpreter where it cannot.

A fork starts in milliseconds with everything the launcher has imported: the task's module and
what it imports (torch, Lightning), Hydra, MLflow. A fresh interpreter imports them again (seconds
for torch), so it is the fallback: when another thread runs in the launcher, a fork would copy
only this one, and a lock the other held (a stream's, an import's) would stay locked in the copy.

The fork is made before the launcher opens its store, so no database connection is shared with
the server or its jobs. The copy keeps the launcher's other open files, as any forked process
does, but closes the launcher's end of its socket: the server sees the socket close when the
launcher dies, and stops its jobs.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import IO, Protocol

from furcate_hydra.execution.forkserver.entry import serve_forked  # loaded before the fork
from furcate_hydra.execution.forkserver.names import SERVER_NAME
from furcate_hydra.execution.forkserver.protocol import WarmContext
from furcate_hydra.new_process import fresh_root_logger, name_process

__all__ = ["ForkedServer", "ServerProcess", "can_fork", "fork_server", "spawn_server"]


class ServerProcess(Protocol):
    """What the client needs of the server's process: a forked one or a ``Popen``."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def can_fork() -> bool:
    """Whether this process can be forked safely now: this is its only thread."""
    return hasattr(os, "fork") and threading.active_count() == 1


def spawn_server(child_sock: socket.socket, piped: bool) -> subprocess.Popen[bytes]:
    """A fresh interpreter running the server on ``child_sock``; it waits for ``Init``."""
    stdio = subprocess.PIPE if piped else None
    # Its own session: a Ctrl-C at the terminal reaches the launcher, which then stops the jobs
    # in order, instead of reaching every process at once.
    # not ``-m``: runpy would run the module a second time, this package having imported it
    code = "import sys; from furcate_hydra.execution.forkserver.entry import main; "
    code += "sys.exit(main(sys.argv))"
    return subprocess.Popen(
        [sys.executable, "-c", code, str(child_sock.fileno())],
        pass_fds=[child_sock.fileno()],
        stdin=subprocess.DEVNULL,
        stdout=stdio,
        stderr=stdio,
        start_new_session=True,
    )


def fork_server(
    child_sock: socket.socket,
    parent_sock: socket.socket,
    preload: list[str],
    context: WarmContext,
    piped: bool,
) -> ForkedServer:
    """Fork this process into the server; it serves ``child_sock`` and never returns here."""
    out = os.pipe() if piped else None
    err = os.pipe() if piped else None
    sys.stdout.flush()  # else what is buffered here would be written twice
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_server(child_sock, parent_sock, preload, context, out, err)
    if out is not None and err is not None:
        os.close(out[1])
        os.close(err[1])
    return ForkedServer(
        pid,
        None if out is None else os.fdopen(out[0], "rb"),
        None if err is None else os.fdopen(err[0], "rb"),
    )


def _become_server(
    child_sock: socket.socket,
    parent_sock: socket.socket,
    preload: list[str],
    context: WarmContext,
    out: tuple[int, int] | None,
    err: tuple[int, int] | None,
) -> None:
    # Never return into the launcher's code, nor run its exit handlers or finalizers.
    code = 1
    try:
        # The launcher owns the terminal's Ctrl-C and a scheduler's SIGUSR1: not the
        # launcher's handlers, which this fork inherited
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        os.setsid()
        name_process(SERVER_NAME)
        parent_sock.close()
        _own_stdio(out, err)
        fresh_root_logger()
        code = serve_forked(child_sock.detach(), preload, context)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _own_stdio(out: tuple[int, int] | None, err: tuple[int, int] | None) -> None:
    """stdin from /dev/null; stdout/stderr to the pipes the launcher reads, if any; and fresh
    ``sys`` streams on them (the launcher's may be wrapped, e.g. captured by a test runner)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for pipe, fd in ((out, 1), (err, 2)):
        if pipe is not None:
            os.dup2(pipe[1], fd)
            os.close(pipe[0])
            os.close(pipe[1])
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if faulthandler.is_enabled():  # onto fd 2, which is each job's own stderr in the job
        faulthandler.enable()


class ForkedServer:
    """The server's process when it is a fork of the launcher (the ``Popen`` calls used)."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is not None:
            assert self.returncode is not None
            return self.returncode
        pidfd = os.pidfd_open(self.pid)
        try:
            if not select.select([pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
        finally:
            os.close(pidfd)
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
