"""How the fork server's process begins: a new interpreter's ``main``, or a fork's
``serve_forked``; either loads what jobs start from (``ForkServer.initialise*``), then serves."""

from __future__ import annotations

import contextlib
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from furcate_hydra.execution.forkserver.protocol import Init, InitFailed, WarmContext
from furcate_hydra.execution.forkserver.server import ORPHAN_GRACE_S, ForkServer

__all__ = ["main", "serve_forked"]


def main(argv: list[str]) -> int:
    """Entry point of a new interpreter (``fork.spawn_server``): ``main([_, <socket fd>])``."""
    # The launcher owns the terminal's Ctrl-C, and a scheduler's SIGUSR1, and decides when
    # jobs stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def initialise(server: ForkServer) -> None:
        message = server.conn.recv()
        if not isinstance(message, Init):
            raise RuntimeError(f"expected Init as the first message, got {type(message).__name__}")
        server.initialise(message)

    return _serve(Connection(int(argv[1])), initialise)


def serve_forked(conn_fd: int, preload: list[str], context: WarmContext) -> int:
    """Entry point in a fork of the launcher (``fork.fork_server``), which has set up the
    process (session, signals, stdio) already; returns the exit status."""
    return _serve(Connection(conn_fd), lambda server: server.initialise_forked(preload, context))


def _serve(conn: Connection, initialise: Callable[[ForkServer], None]) -> int:
    server = ForkServer(conn)
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop(ORPHAN_GRACE_S))
    try:
        initialise(server)
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
