"""What says a job ran out of GPU memory: torch's own errors, raised for real in processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from furcate_hydra.execution.gpu.out_of_memory import cuda_out_of_memory, stderr_size

# torch's own exception, as the caching allocator raises it (the class exists in CPU builds)
RAISE_OOM = """
import torch
raise torch.cuda.OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
)
"""

# the same error inside a DataLoader worker: the main process re-raises it in its own words
RAISE_OOM_IN_WORKER = """
import torch
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")

if __name__ == "__main__":
    for batch in DataLoader(Data(), num_workers=1):
        pass
"""

# a library's failure printed by native code, then an abort without a Python traceback
ABORT_AFTER_CUDA_ERROR = """
import os, sys
sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\\n")
sys.stderr.write("  what():  CUDA error: out of memory\\n")
sys.stderr.flush()
os.abort()
"""


def run(code: str, stderr: Path) -> str:
    with stderr.open("ab") as err:
        subprocess.run([sys.executable, "-c", textwrap.dedent(code)], stderr=err, check=False)
    return stderr.read_text()


def test_torch_out_of_memory_error_is_recognised(tmp_path: Path) -> None:
    text = run(RAISE_OOM, tmp_path / "stderr.log")
    line = cuda_out_of_memory(text, tmp_path / "none.log")
    assert line is not None and "OutOfMemoryError: CUDA out of memory" in line


def test_out_of_memory_in_a_dataloader_worker_is_recognised(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.log"
    text = run(RAISE_OOM_IN_WORKER, stderr)
    assert "in DataLoader worker process 0" in text  # what torch wraps it in
    assert cuda_out_of_memory(None, stderr) is not None


def test_a_crash_that_only_printed_cuda_s_message_is_recognised(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.log"
    run(ABORT_AFTER_CUDA_ERROR, stderr)
    assert cuda_out_of_memory(None, stderr) == "what():  CUDA error: out of memory"


def test_an_earlier_attempt_s_out_of_memory_is_not_this_attempt_s(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.log"
    run(RAISE_OOM, stderr)
    since = stderr_size(stderr)
    run("raise ValueError('a bug')", stderr)
    assert cuda_out_of_memory("ValueError: a bug", stderr, since) is None
    assert cuda_out_of_memory("ValueError: a bug", stderr, 0) is not None


def test_other_errors_and_missing_files_are_not_out_of_memory(tmp_path: Path) -> None:
    text = run("raise MemoryError('host memory')", tmp_path / "stderr.log")
    assert cuda_out_of_memory(text, tmp_path / "stderr.log") is None
    assert cuda_out_of_memory(None, tmp_path / "missing.log") is None
    assert stderr_size(tmp_path / "missing.log") == 0
