"""The launcher's handle on its warm fork server process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import IO

from furcate_hydra.errors import ForkServerError
from furcate_hydra.execution import interrupts
from furcate_hydra.execution.forkserver.protocol import (
    Init,
    InitFailed,
    Kill,
    Ready,
    SetContext,
    Shutdown,
    Start,
    Stopped,
)

__all__ = ["ConsoleOutput", "ForkServerClient"]

# Where the server's console output goes instead of the launcher's stdout/stderr: whole lines,
# and whether they came from stderr.
ConsoleOutput = Callable[[bytes, bool], None]

# Longest a wait goes without looking for a Ctrl-C that Python lost (see interrupts.py).
_CHECK_EVERY_S = 0.5


class ForkServerClient:
    """Starts the server, sends it requests and receives its events.

    Not thread-safe: one owner (the slot pool) drives it from one thread.
    """

    def __init__(
        self,
        preload: list[str],
        context: bytes,
        *,
        start_timeout_s: float = 600.0,
        output: ConsoleOutput | None = None,
    ):
        """``output``: None, the server (and the job output it echoes) writes to the launcher's
        stdout and stderr; else every line goes to ``output``, e.g. a live view printing
        above itself."""
        parent_sock, child_sock = socket.socketpair()
        piped = subprocess.PIPE if output is not None else None
        with child_sock:
            # Its own session: a Ctrl-C at the terminal reaches the launcher, which then stops
            # the jobs in order, instead of reaching every process at once.
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "furcate_hydra.execution.forkserver.server",
                    str(child_sock.fileno()),
                ],
                pass_fds=[child_sock.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=piped,
                stderr=piped,
                start_new_session=True,
            )
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
        began = time.perf_counter()
        try:
            self._conn.send(Init(list(sys.path), os.getcwd(), preload, context))
            reply = self._wait_ready(start_timeout_s)
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
            raise ForkServerError(f"The fork server did not start within {start_timeout_s:.0f} s.")
        self.ready = reply
        self.start_s = time.perf_counter() - began

    def _wait_ready(self, timeout_s: float) -> object | None:
        # In slices, so that a Ctrl-C Python lost while this process imported is seen.
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
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

    def kill(self, key: str, signum: int) -> None:
        self._conn.send(Kill(key, signum))

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
