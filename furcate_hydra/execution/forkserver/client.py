"""The launcher's handle on its warm fork server process."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import IO

from furcate_hydra.errors import ForkServerError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.forkserver.fork import (
    ServerProcess,
    can_fork,
    fork_server,
    spawn_server,
)
from furcate_hydra.execution.forkserver.protocol import (
    Init,
    InitFailed,
    Kill,
    Placement,
    Preload,
    Ready,
    Release,
    SetContext,
    Shutdown,
    Start,
    Stopped,
    WarmContext,
)

__all__ = ["HEAVY_MODULES", "ConsoleOutput", "ForkServerClient", "start_server"]

# Where the server's console output goes instead of the launcher's stdout/stderr: whole lines,
# and whether they came from stderr.
ConsoleOutput = Callable[[bytes, bool], None]

# Longest a wait goes without looking for a Ctrl-C that Python lost (see interrupts.py).
_CHECK_EVERY_S = 0.5
# Modules a new interpreter imports when ``preload`` is unset and the launcher has them loaded:
# what a task module that imports them needs warm (a fork has everything already).
HEAVY_MODULES = ("torch", "pytorch_lightning", "lightning", "mlflow")

log = logging.getLogger(__name__)


def start_server(
    preload: Sequence[str] | None,
    context: bytes,
    warm: WarmContext | None,
    output: ConsoleOutput | None,
    job_imports: Sequence[str] = (),
) -> ForkServerClient:
    """The fork server: a fork of this process where it can be one (``warm`` given, no other
    thread), importing only the ``preload`` it lacks; else a new interpreter importing
    ``preload`` (unset: the heavy modules this process has) and the task's module. Either
    imports ``job_imports`` too, what every job would import before its task."""
    modules = [*(preload or ()), *job_imports]
    if warm is not None and can_fork():
        missing = [name for name in modules if name not in sys.modules]
        also = f"; importing {', '.join(missing)}" if missing else ""
        log.info("furcate: starting the fork server (a fork of this process%s) …", also)
        return ForkServerClient(modules, context, warm=warm, output=output)
    if preload is None:
        modules = [*(name for name in HEAVY_MODULES if name in sys.modules), *job_imports]
    log.info(
        "furcate: starting the fork server (a new interpreter, importing %s once, for every "
        "job to start from) …",
        ", ".join([*modules, "the task's module"]),
    )
    return ForkServerClient(modules, context, output=output)


class ForkServerClient:
    """Starts the server, sends it requests and receives its events.

    The constructor returns as soon as the server's process exists (a fork takes milliseconds);
    the server loads what it still needs meanwhile, and ``wait_ready`` waits for that.
    Not thread-safe: one owner (the slot pool) drives it from one thread.
    """

    def __init__(
        self,
        preload: list[str],
        context: bytes,
        *,
        warm: WarmContext | None = None,
        start_timeout_s: float = 600.0,
        output: ConsoleOutput | None = None,
    ):
        """``warm``: the context ``context`` pickles, in this process: given, and with no
        other thread running here, the server is a fork of this process.
        ``output``: None, the server (and the job output it echoes) writes to the launcher's
        stdout and stderr; else every line goes to ``output``, e.g. a live view printing
        above itself."""
        parent_sock, child_sock = socket.socketpair()
        piped = output is not None
        self.forked = warm is not None and can_fork()
        with child_sock:
            self.process: ServerProcess
            if warm is not None and self.forked:
                self.process = fork_server(child_sock, parent_sock, preload, warm, piped)
            else:
                self.process = spawn_server(child_sock, piped)
        if output is not None:
            assert self.process.stdout is not None and self.process.stderr is not None
            for stream, is_stderr in ((self.process.stdout, False), (self.process.stderr, True)):
                threading.Thread(
                    target=_forward_lines,
                    args=(stream, output, is_stderr),
                    name="furcate-output",
                    daemon=True,
                ).start()
        self._conn = Connection(parent_sock.detach())
        self._began = time.perf_counter()
        self._timeout_s = start_timeout_s
        self.ready: Ready | None = None
        self.start_s = 0.0
        if not self.forked:
            try:
                self._conn.send(Init(list(sys.path), os.getcwd(), preload, context))
            except BaseException:
                self.terminate(wait_s=0.0)
                raise

    def wait_ready(self) -> Ready:
        """Block until the server has loaded everything; idempotent.

        Raises:
            ForkServerError: it could not load the task, or did not within the time limit.
        """
        if self.ready is not None:
            return self.ready
        try:
            reply = self._wait_ready(self._timeout_s)
        except BaseException:  # Ctrl-C during the warm-up: no server is left behind
            # It has no job yet, and may be busy importing for seconds before it would see its
            # socket close: stop it at once.
            self.terminate(wait_s=0.0)
            raise
        if isinstance(reply, InitFailed):
            self.terminate()
            raise ForkServerError(f"The fork server could not load the task:\n{reply.error}")
        if not isinstance(reply, Ready):
            self.terminate()
            raise ForkServerError(f"The fork server did not start within {self._timeout_s:.0f} s.")
        self.ready = reply
        self.start_s = time.perf_counter() - self._began
        return reply

    def _wait_ready(self, timeout_s: float) -> object | None:
        # In slices, so that a Ctrl-C Python lost while this process imported is seen.
        deadline = self._began + timeout_s
        while (left := deadline - time.perf_counter()) > 0:
            interrupts.check()
            reply = self.receive(timeout=min(left, _CHECK_EVERY_S))
            if reply is not None:
                return reply
        return None

    def fileno(self) -> int:
        return self._conn.fileno()

    def set_context(self, context: bytes) -> None:
        self._conn.send(SetContext(context))

    def start(self, start: Start) -> None:
        self._conn.send(start)

    def release(self, placement: Placement) -> None:
        self._conn.send(Release(placement))

    def kill(self, key: str, signum: int) -> None:
        self._conn.send(Kill(key, signum))

    def preload(self, modules: Sequence[str], probe_limit_s: float | None = None) -> None:
        """Have the server import ``modules`` (what jobs imported), while it goes on serving;
        its ``Preloaded`` says what it did. ``probe_limit_s``: the most its trial of the
        modules not known to import cleanly may take (None: the protocol's default)."""
        limit = {} if probe_limit_s is None else {"probe_limit_s": probe_limit_s}
        self._conn.send(Preload(list(modules), **limit))

    def receive(self, timeout: float | None) -> object | None:
        """Next event from the server, or None when ``timeout`` passes first.

        Raises:
            ForkServerError: the server process is gone.
        """
        try:
            if not self._conn.poll(timeout):
                return None
            event: object = self._conn.recv()
            return event
        except (EOFError, OSError) as exc:
            code = self.process.poll()
            raise ForkServerError(
                f"The fork server stopped unexpectedly (exit status {code}); "
                "its error, if any, is on the launcher's stderr above."
            ) from exc

    def shutdown(self, grace_s: float) -> None:
        """Stop every job (SIGTERM, then SIGKILL after ``grace_s``) and the server itself."""
        try:
            self._conn.send(Shutdown(grace_s))
            deadline = time.monotonic() + grace_s + 5.0
            while time.monotonic() < deadline:
                event = self.receive(timeout=max(0.0, deadline - time.monotonic()))
                if event is None or isinstance(event, Stopped):
                    break
        except (ForkServerError, OSError):
            pass
        self.terminate()

    def terminate(self, wait_s: float = 10.0) -> None:
        """Make sure the server process is gone: it stops its jobs when its socket closes, and
        is killed with whatever is left in its session after ``wait_s``."""
        self._conn.close()
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _forward_lines(stream: IO[bytes], output: ConsoleOutput, is_stderr: bool) -> None:
    # Until the server closes its end: it exits, and so does this thread.
    with stream:
        for line in iter(stream.readline, b""):
            with contextlib.suppress(Exception):  # a broken console must not block the server
                output(line, is_stderr)
