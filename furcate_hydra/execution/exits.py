"""Say in words how a job's process ended."""

from __future__ import annotations

import os
import signal

__all__ = ["describe_wait_status"]

_HINTS = {
    signal.SIGKILL: (
        "SIGKILL usually means the kernel's out-of-memory killer (check `dmesg`), or a person "
        "or scheduler killing the job"
    ),
    signal.SIGSEGV: "a segmentation fault, usually a bug in native code (a CUDA/C extension)",
    signal.SIGABRT: "an abort, usually a failed assertion in native code",
    signal.SIGBUS: "a bus error, often a truncated memory-mapped file or exhausted /dev/shm",
    signal.SIGTERM: "SIGTERM: something asked the job to stop",
}
_SIGNUMS = {int(signum) for signum in _HINTS}


def describe_wait_status(wait_status: int) -> str:
    """Turn a ``waitpid`` status into a sentence: the signal or exit code and a likely cause."""
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        text = f"the job's process was killed by {name} (exit code {-signum})"
        hint = _HINTS.get(signal.Signals(signum)) if signum in _SIGNUMS else None
        return f"{text}; {hint}" if hint else text
    code = os.waitstatus_to_exitcode(wait_status)
    return (
        f"the job's process exited with code {code} before reporting a result "
        "(os._exit, or a crash while setting up or saving the result)"
    )
