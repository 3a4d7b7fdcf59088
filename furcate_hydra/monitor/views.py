"""Where a sweep's progress is shown: a live view redrawn in place on a terminal, plain status
lines in a log, or nothing (``hydra.launcher.progress``: auto, plain, off).

Job output echoed to the console would tear a view redrawn in place, so each view also owns
the console's output: the launcher hands job output lines to ``write_output``, which prints
them above a live view and as they are elsewhere.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import IO, TYPE_CHECKING, Any, Protocol

from furcate_hydra.monitor.render import (
    counts_text,
    duration_text,
    metrics_text,
    status_line,
    timing_text,
)
from furcate_hydra.monitor.tally import SweepSnapshot, SweepTally

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["PROGRESS_MODES", "ProgressView", "make_view"]

log = logging.getLogger(__name__)

PROGRESS_MODES = ("auto", "plain", "off")


class ProgressView(Protocol):
    # whether job output must come through write_output (a view redrawn in place)
    owns_output: bool

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop redrawing; the last state stays on screen (live) or is logged (plain)."""
        ...

    def write_output(self, data: bytes, stderr: bool) -> None:
        """Job output for the console, whole lines."""
        ...


class _RawOutput:
    """Job output straight to the launcher's own stdout and stderr."""

    owns_output = False

    def write_output(self, data: bytes, stderr: bool) -> None:
        stream = sys.stderr if stderr else sys.stdout
        try:
            stream.flush()
            stream.buffer.write(data)
            stream.buffer.flush()
        except (OSError, ValueError, AttributeError):
            pass  # a closed console must not stop the sweep


class NoView(_RawOutput):
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class PlainStatus(_RawOutput):
    """A status line in the log every ``every_s`` seconds while jobs run, and one at the end."""

    def __init__(self, tally: SweepTally, every_s: float) -> None:
        self.tally = tally
        self.every_s = every_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped.clear()  # a session streams once per batch Hydra's sweepers launch
        self._thread = threading.Thread(target=self._run, name="furcate-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            snap = self.tally.snapshot()
            if snap.running or snap.queued:
                log.info(status_line(snap))

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            log.info(status_line(self.tally.snapshot()))


class LiveView:
    """A rich Live view: a header of counts and times, a table of running jobs. Log records
    and job output are printed above it."""

    owns_output = True

    def __init__(self, tally: SweepTally, console_file: IO[str]) -> None:
        from rich.console import Console

        self.tally = tally
        self.console = Console(file=console_file)
        self._live: object | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        self._lock = threading.Lock()

    def __rich__(self) -> RenderableType:
        return render_live(self.tally.snapshot())

    def start(self) -> None:
        from rich.live import Live

        live = Live(self, console=self.console, refresh_per_second=2, transient=False)
        live.start()
        self._live = live
        # Hydra's log handlers hold the real stdout/stderr: point them at the console, which
        # prints above the view, until it stops.
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (
                sys.__stdout__,
                sys.__stderr__,
                sys.stdout,
                sys.stderr,
            ):
                self._handlers.append((handler, handler.stream))
                handler.setStream(_ConsoleStream(self))

    def stop(self) -> None:
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()
        live = self._live
        self._live = None
        if live is not None:
            live.stop()  # type: ignore[attr-defined]

    def write_output(self, data: bytes, stderr: bool) -> None:
        self.print_text(data.decode(errors="replace"))

    def print_text(self, text: str) -> None:
        with self._lock:
            self.console.print(
                text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True, emoji=False
            )


class _ConsoleStream:
    """A text stream for a logging handler that prints through the live view."""

    def __init__(self, view: LiveView) -> None:
        self.view = view
        self._partial = ""

    def write(self, text: str) -> int:
        lines, _, self._partial = (self._partial + text).rpartition("\n")
        if lines:
            self.view.print_text(lines)
        return len(text)

    def flush(self) -> None:
        pass


def render_live(snap: SweepSnapshot) -> RenderableType:
    """The view: counts and times on one line, then one row per running job."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    header = Text(f"furcate: {counts_text(snap)} | {timing_text(snap)}")
    if snap.best:
        header.append(f" | best {snap.best}", style="bold")
    if not snap.running:
        return header
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="dim")
    for column in ("job", "slot", "elapsed", "progress", "overrides"):
        table.add_column(column, no_wrap=column != "overrides", overflow="ellipsis")
    for job in snap.running:
        table.add_row(
            f"#{job.num}",
            job.slot,
            duration_text(snap.at - job.started_at),
            metrics_text(job.metrics, job.epoch),
            job.label or "(no overrides)",
        )
    return Group(header, table)


def make_view(mode: str, tally: SweepTally, every_s: float) -> ProgressView:
    """The view for a mode: ``auto`` is live on a terminal and plain lines elsewhere (CI,
    nohup, a log file), which never carry control codes."""
    if mode == "off":
        return NoView()
    if mode == "auto" and sys.stdout.isatty():
        return LiveView(tally, sys.stdout)
    return PlainStatus(tally, every_s)
