"""What a job says of its own GPU memory as it ends, for ``jobs_per_gpu=auto`` where NVML's
readings could not be matched to it (a container with its own pid namespace, a job shorter
than a reading's interval).

torch's caching allocator knows the most it reserved; NVML's figure for a process also holds
the CUDA context and the libraries' kernels, which torch does not count. On an H200 (driver
580, torch 2.11) a tiny MLP job held 854 MiB by NVML of which torch reserved 112 MiB:
``CONTEXT_BYTES`` is that difference, rounded up, and is added to torch's figure.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["CONTEXT_BYTES", "torch_gpu_peak"]

CONTEXT_BYTES = 768 * 2**20


def torch_gpu_peak() -> int | None:
    """The most GPU memory this process's torch reserved on any of its GPUs plus a CUDA
    context; None where torch was not imported or never initialised CUDA (never starts it)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        peaks = [
            int(torch.cuda.max_memory_reserved(index)) for index in range(torch.cuda.device_count())
        ]
    except Exception:  # a broken CUDA state at exit: nothing to say
        return None
    return max(peaks, default=0) + CONTEXT_BYTES
