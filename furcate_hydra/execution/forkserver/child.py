"""What a job's process does between ``fork()`` and its exit.

The order matters: the new session comes first (so stopping the job stops its DataLoader workers
too), then the slot's environment (so ``CUDA_VISIBLE_DEVICES`` is in place before anything can
initialise CUDA), then pinning, and only then the job itself. A job forked ahead of its slot
does its set-up (Hydra's, which touches no GPU) first and then waits at the gate, just before
the job's own code, until the server writes it its slot: then only the slot's environment and
pinning are left between a slot freeing and the next job running.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, NoReturn

import cloudpickle

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.execution.forkserver.gpu_report import torch_gpu_peak
from furcate_hydra.execution.forkserver.job_imports import ImportWatch, installed_imports
from furcate_hydra.execution.forkserver.learned_imports import WELL_KNOWN
from furcate_hydra.execution.forkserver.names import JOB_NAME
from furcate_hydra.execution.forkserver.protocol import (
    ChildReport,
    Placement,
    Start,
    WarmContext,
)
from furcate_hydra.job_secrets import hand_down
from furcate_hydra.new_process import name_process
from furcate_hydra.preemption import PREEMPTED_EXIT_CODE, JobPreempted

__all__ = ["CHILD_SETUP_FAILED", "run_child"]

# Exit code of a child whose own set-up failed before the job could run (EX_SOFTWARE).
CHILD_SETUP_FAILED = 70


def run_child(
    start: Start,
    context: WarmContext,
    out_fd: int,
    err_fd: int,
    inherited_fds: Iterable[int],
    gate_fd: int | None,
    done_fd: int,
) -> NoReturn:
    """Become the job's process, run it, leave a report in ``start.result_path`` and exit.

    ``gate_fd``: for a job forked ahead (no placement yet), where its placement will come from.
    ``done_fd``: written just before the exit, once the report and the output are out: the
    server hands the slot on then, not after the kernel has torn the process down; before
    that, a line each time a heavy package the server lacks is imported (``ImportWatch``).
    """
    code = CHILD_SETUP_FAILED
    server_has = frozenset(sys.modules)
    try:
        os.setsid()
        name_process(JOB_NAME)
        _close_quietly(inherited_fds)
        _redirect_stdio(out_fd, err_fd)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.update(start.env)
        hand_down(start.secrets)
        ImportWatch([n for n in WELL_KNOWN if n not in server_has], done_fd).install()
        gate: Callable[[], None] = _no_gate
        if start.placement is not None:
            _take_place(start.placement)
        elif gate_fd is not None:
            gate = functools.partial(_wait_for_place, gate_fd)
        report = replace(
            _run_job(context, start.payload, gate),
            gpu_peak_bytes=torch_gpu_peak(),
            imported=installed_imports(server_has),
        )
        # the launcher reads it at once and deletes it: no fsync on the way out
        atomic_write_bytes(start.result_path, _pickle_report(report), durable=False)
        code = report.exit_code or 0
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_everything()
    with contextlib.suppress(OSError):
        os.write(done_fd, b"d")
    os._exit(code)


def _no_gate() -> None:
    pass


def _wait_for_place(gate_fd: int) -> None:
    """Block until the server writes this job its placement; without one (the server went
    away, or the job was cancelled before its start) exit at once: it never ran."""
    chunks = []
    while chunk := os.read(gate_fd, 65536):
        chunks.append(chunk)
    os.close(gate_fd)
    if not chunks:
        os._exit(CHILD_SETUP_FAILED)
    _take_place(pickle.loads(b"".join(chunks)))


def _take_place(placement: Placement) -> None:
    """The slot's environment, before the job's code can initialise CUDA; pinning; threads."""
    os.environ.update(placement.env)
    os.environ["FURCATE_JOB_STARTED_AT"] = repr(time.time())
    if placement.cpus:
        os.sched_setaffinity(0, placement.cpus)
    _apply_thread_count(placement.threads)
    _forget_cached_device_counts()


def _run_job(context: WarmContext, payload: bytes, gate: Callable[[], None]) -> ChildReport:
    try:
        value = context.run(payload, gate)
        return ChildReport(value=value, failure=getattr(value, "failure", None))
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
