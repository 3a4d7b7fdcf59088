"""Ctrl-C, SIGTERM and SIGUSR1 in the launcher's process: a KeyboardInterrupt never lost.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Raised inside a
weakref callback or a ``__del__`` (frequent while the launcher imports and unpickles during the
fork server's warm-up), it is printed as "Exception ignored" and lost, and the sweep runs on.
The handler here also remembers the signal, and ``check()`` raises it again at the launcher's
next safe point: its waits for the fork server, its submits.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["check", "install", "received", "restore"]

# SIGUSR1 too: SLURM's `--signal=USR1@<seconds>` sends it to every process of a job step, the
# launcher's included; its default action would end the launcher without recording anything.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_received: list[int] = []
_previous: dict[int, Any] = {}


def install() -> None:
    """Handle SIGINT, SIGTERM and SIGUSR1 here until ``restore``; from the main thread only
    (elsewhere Python delivers no signal, and the caller's handlers stay)."""
    # A new session never inherits a signal from before it: one received under an earlier
    # install (in a process that runs several sessions) is forgotten, handled or not.
    _received.clear()
    if threading.current_thread() is not threading.main_thread() or _previous:
        return
    for signum in _SIGNALS:
        _previous[signum] = signal.signal(signum, _handle)


def restore() -> None:
    """Put back the handlers ``install`` replaced (from the main thread: only it may)."""
    if threading.current_thread() is not threading.main_thread():
        return
    while _previous:
        signum, handler = _previous.popitem()
        signal.signal(signum, handler)


def received() -> int | None:
    """The first signal received since ``install``, if any (after ``restore`` too: the
    session's exit status names it)."""
    return _received[0] if _received else None


def check() -> None:
    """Raise the KeyboardInterrupt of a signal received before, if Python lost it; only while
    installed: a signal of a session that ended is not the next caller's (a process may run
    a scheduler outside any session, or one session after another)."""
    if _received and _previous:
        raise KeyboardInterrupt(f"received {signal.Signals(_received[0]).name}")


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")
