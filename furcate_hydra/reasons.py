"""Why a job did not finish, in one line, from the error text the launcher records.

    "ValueError: lr must be positive\\n..."                     → ValueError: lr must be positive
    "JobCrashedError: Job #2 (x=1) crashed: the job's process
     was killed by SIGKILL (exit code -9); SIGKILL usually…"   → killed by SIGKILL
    "… killed by SIGSEGV (exit code -11) …"                    → segfault (SIGSEGV)
    "… the job called sys.exit(3) …"                           → sys.exit(3)
    "… exited with code 7 before reporting a result …"         → os._exit(7)
    "launcher stopped", "… stopped by the launcher …"          → stopped by the launcher

The texts are those of ``execution/exits.py``, the fork server's child and the run ledger (the
run's ``furcate.error`` tag, ``run_data.json``'s ``error``); the end-of-sweep summary and
``furcate status`` both say a job's reason through ``one_line_reason``.
"""

from __future__ import annotations

import re

__all__ = ["interrupted_reason", "one_line_reason", "pruned_reason"]

# Longer reasons are cut here: a reason is a table cell, the logs hold the rest.
MAX_REASON = 200

_SIGNAL_NAMES = {
    "SIGSEGV": "segfault (SIGSEGV)",
    "SIGABRT": "abort (SIGABRT)",
    "SIGBUS": "bus error (SIGBUS)",
}
# describe_wait_status's words, matched whole so a task's own message that mentions a signal
# stays the task's message
_KILLED = re.compile(r"the job's process was killed by (SIG[A-Z0-9]+|signal \d+)")
_OS_EXIT = re.compile(r"the job's process exited with code (-?\d+) before reporting a result")
_SYS_EXIT = re.compile(r"the job called (sys\.exit\(.*\))$", re.MULTILINE)
_STOPPED = re.compile(r"^launcher stopped$|stopped by the launcher", re.MULTILINE)
_LOST = re.compile(r"The fork server stopped unexpectedly[^\n]*")
# JobCrashedError's own words before the reason: "Job #3 (lr=0.1) crashed: "
_CRASH_PREFIX = re.compile(
    r"^JobCrashedError: Job #\d+ \(.*?\) (?:failed|crashed|cancelled|lost|preempted): "
)


def one_line_reason(error: str | None) -> str | None:
    """The reason a recorded error gives, in one line; None when there is no error."""
    if not error or not error.strip():
        return None
    killed = _KILLED.search(error)
    if killed:
        signal = killed.group(1)
        return _SIGNAL_NAMES.get(signal, f"killed by {signal}")
    exited = _OS_EXIT.search(error)
    if exited:
        return f"os._exit({exited.group(1)})"
    called = _SYS_EXIT.search(error)
    if called:
        return called.group(1)
    if _STOPPED.search(error):
        return "stopped by the launcher"
    lost = _LOST.search(error)
    if lost:
        return "lost: " + lost.group(0)[0].lower() + lost.group(0)[1:]
    text = _CRASH_PREFIX.sub("", error.strip())
    line = next(line.strip() for line in text.splitlines() if line.strip())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def pruned_reason(epoch: int | None) -> str:
    """Why a pruned trial's job stopped early."""
    return "pruned" if epoch is None else f"pruned at epoch {epoch}"


def interrupted_reason(why: str) -> str:
    """A job left RUNNING by a launcher that is gone; ``why`` says how it is known."""
    return f"interrupted: {why}"
