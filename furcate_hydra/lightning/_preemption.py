"""SIGTERM and SIGUSR1 while ``fit`` trains: remembered, acted on at the next batch's end.

A signal handler may run between any two bytecodes, in the middle of an optimizer step or a
checkpoint write, so it only notes the signal; ``AtomicCheckpoint`` saves and stops where the
state is whole. Lightning installs its own SIGTERM handler when fit starts (its handler raises
at the end of the batch, before anything is saved), so the watch takes the signal back then.
DataLoader workers forked while the watch is installed inherit it, so a signal sent to the whole
process group does not kill them before the job has saved.

Under ``ddp_spawn`` the job's process trains nothing: its ranks are processes it spawned, which
a signal sent to the job's process alone would not reach. There the watch passes the signal on
to its child processes (``forward_to_children``), and the ranks agree on where to stop.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from furcate_hydra.preemption import PREEMPTION_SIGNALS

__all__ = ["PreemptionWatch"]


class PreemptionWatch:
    """Notes the first SIGTERM or SIGUSR1 between ``install`` and ``restore``."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.forward_to_children = False
        self._previous: dict[int, Any] = {}

    @property
    def active(self) -> bool:
        return bool(self._previous)

    def install(self) -> None:
        """Take the signals (from the main thread only: elsewhere Python delivers none)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for signum in PREEMPTION_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._note)

    def reclaim(self) -> None:
        """Take the signals back from whoever replaced the handlers since ``install``."""
        if self._previous and threading.current_thread() is threading.main_thread():
            for signum in PREEMPTION_SIGNALS:
                signal.signal(signum, self._note)

    def restore(self) -> None:
        """Put back the handlers ``install`` replaced."""
        if threading.current_thread() is not threading.main_thread():
            return
        while self._previous:
            signum, handler = self._previous.popitem()
            signal.signal(signum, handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        if self.forward_to_children:
            _forward(signum)


def _forward(signum: int) -> None:
    """Send ``signum`` to this process's children (the ranks ``ddp_spawn`` started), but not
    to multiprocessing's resource tracker, which must outlive them to clean up."""
    import psutil

    for child in psutil.Process().children():
        try:
            if not any("resource_tracker" in part for part in child.cmdline()):
                child.send_signal(signum)
        except psutil.Error:  # ended meanwhile
            continue
