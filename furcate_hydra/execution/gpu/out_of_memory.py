"""Whether a job's attempt ended because its GPU ran out of memory, from what it left behind.

torch raises ``torch.OutOfMemoryError`` ("CUDA out of memory. Tried to allocate ..."); a
DataLoader worker's re-raised in the main process reads "Caught OutOfMemoryError in
DataLoader worker process 0" followed by the same message; CUDA's own kernels and libraries
say "CUDA error: out of memory" or ``CUBLAS_STATUS_ALLOC_FAILED``, sometimes only on stderr
from a process that then aborts without a Python traceback. So the job's error is read first,
then what the attempt wrote to stderr.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["STDERR_TAIL_BYTES", "cuda_out_of_memory", "stderr_size"]

# The end of an attempt's stderr is where a fatal error is; tracebacks are short.
STDERR_TAIL_BYTES = 64 * 1024

_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED"
)


def cuda_out_of_memory(error: str | None, stderr: Path, since: int = 0) -> str | None:
    """The line that says the attempt ran out of CUDA memory, or None.

    Args:
        error: The job's error as it reported it (a formatted traceback), if any.
        stderr: The job's stderr file, shared by its attempts.
        since: Where this attempt's output starts in it (its size when the attempt began).
    """
    for text in (error or "", _tail(stderr, since)):
        match = _OOM.search(text)
        if match is not None:
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            return text[start : None if end < 0 else end].strip()
    return None


def stderr_size(stderr: Path) -> int:
    """Where the next attempt's output starts in ``stderr`` (0 if it is not there yet)."""
    try:
        return stderr.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, since: int) -> str:
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(since, size - STDERR_TAIL_BYTES))
            return file.read().decode("utf-8", "replace")
    except OSError:
        return ""
