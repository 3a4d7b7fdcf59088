"""What a job's process does between ``fork()`` and its exit.

The order matters: the new session comes first (so stopping the job stops its DataLoader workers
too), then the slot's environment (so ``CUDA_VISIBLE_DEVICES`` is in place before anything can
initialise CUDA), then pinning, and only then the job itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from typing import Any, NoReturn

import cloudpickle

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.execution.forkserver.protocol import ChildReport, Start, WarmContext
from furcate_hydra.preemption import PREEMPTED_EXIT_CODE, JobPreempted

__all__ = ["CHILD_SETUP_FAILED", "run_child"]

# Exit code of a child whose own set-up failed before the job could run (EX_SOFTWARE).
CHILD_SETUP_FAILED = 70


def run_child(
    start: Start, context: WarmContext, out_fd: int, err_fd: int, inherited_fds: Iterable[int]
) -> NoReturn:
    """Become the job's process, run it, leave a report in ``start.result_path`` and exit."""
    code = CHILD_SETUP_FAILED
    try:
        os.setsid()
        _close_quietly(inherited_fds)
        _redirect_stdio(out_fd, err_fd)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.update(start.env)
        os.environ["FURCATE_JOB_STARTED_AT"] = repr(time.time())
        if start.cpus:
            os.sched_setaffinity(0, start.cpus)
        _apply_thread_count(start.threads)
        _forget_cached_device_counts()
        report = _run_job(context, start.payload)
        atomic_write_bytes(start.result_path, _pickle_report(report))
        code = report.exit_code or 0
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_everything()
    os._exit(code)


def _run_job(context: WarmContext, payload: bytes) -> ChildReport:
    try:
        return ChildReport(value=context.run(payload))
    except JobPreempted as exc:
        return ChildReport(preempted=str(exc), exit_code=PREEMPTED_EXIT_CODE)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return ChildReport(error=f"the job called sys.exit({exc.code!r})", exit_code=code)
    except BaseException:
        return ChildReport(error=traceback.format_exc())


def _pickle_report(report: ChildReport) -> bytes:
    try:
        return bytes(cloudpickle.dumps(report))
    except Exception as exc:
        # An unpicklable return value must fail its job with a reason, not vanish.
        value_type = type(report.value).__qualname__
        error = f"the job's return value of type {value_type} could not be pickled: {exc!r}"
        return bytes(cloudpickle.dumps(ChildReport(error=error)))


def _close_quietly(fds: Iterable[int]) -> None:
    # The server's socket and the other jobs' pipes must not stay open in this job: a stray
    # write end would keep another job's output from ever reaching end-of-file.
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _redirect_stdio(out_fd: int, err_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _apply_thread_count(threads: int | None) -> None:
    if threads is None:
        return
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def _forget_cached_device_counts() -> None:
    # torch and Lightning memoise the device count; a value cached in the server (under the
    # server's CUDA_VISIBLE_DEVICES) would be wrong for this slot's device.
    torch_cuda: Any = sys.modules.get("torch.cuda")
    if torch_cuda is not None and hasattr(torch_cuda, "_cached_device_count"):
        torch_cuda._cached_device_count = None
    fabric_cuda = sys.modules.get("lightning_fabric.accelerators.cuda")
    for name in ("num_cuda_devices", "is_cuda_available"):
        cache_clear = getattr(getattr(fabric_cuda, name, None), "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


def _flush_everything() -> None:
    # os._exit skips interpreter shutdown, so flush what would otherwise be lost.
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
