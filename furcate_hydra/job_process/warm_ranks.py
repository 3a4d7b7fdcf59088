"""DDP ranks started warm: each rank that Lightning's subprocess launcher (``strategy=ddp``,
FSDP, Fabric's ``launch``) starts in a furcate job is a fork of the job's process that runs
Lightning's command as a new interpreter would, not a new interpreter importing torch,
Lightning and MLflow again (~4.6 s a job here).

    job's process, lightning=auto: install_for_job(route_ranks) ──► each Lightning namespace
      it imports: its subprocess launchers start their ranks here (lightning_private)
    trainer.fit ─► Lightning: rank k's command, environment and working dir, its own
      ─► cold_start_reason(): CUDA started, a thread Python did not start (OpenMP's pool, after
         a parallel torch op), a process group already, not Linux, a command a fork cannot
         become ─► Lightning's own Popen, and one log line that says why
      ─► otherwise start_rank: fork; the child becomes ``python <command>`` and exits as it
         would (fresh_interpreter); Lightning gets a RankProcess, which does what it asks of
         a Popen (poll, returncode, send_signal, kill)

A rank stays in the job's process group (stopping the job stops it) and writes to the job's
stdout and stderr, as Lightning's Popen would have it. ``ddp_spawn`` is left alone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from furcate_hydra.job_process.fresh_interpreter import Command, run_as_interpreter
from furcate_hydra.job_process.lightning_private import (
    LightningPrivateMoved,
    Popen,
    route_rank_processes,
)

__all__ = ["RankProcess", "cold_start_reason", "route_ranks", "start_rank"]

log = logging.getLogger(__name__)

_WAIT_STEP_S = 0.01  # RankProcess.wait's polling, with a timeout


def route_ranks(namespace: str) -> None:
    """(``hydra.launcher.lightning=auto``, once ``namespace`` is imported) Its subprocess
    launchers start their ranks warm where they can."""
    try:
        route_rank_processes(namespace, _popen_for_call)
    except LightningPrivateMoved as exc:  # a speed-up lost, not the job: said, and cold
        log.warning("%s DDP ranks start as new interpreters.", exc)


def _popen_for_call() -> Popen:
    reason = cold_start_reason()
    if reason is None:
        return _start_or_popen
    log.info("furcate: this job's DDP ranks start as new interpreters: %s.", reason)
    return subprocess.Popen


def _start_or_popen(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    **kwargs: Any,
) -> RankProcess | subprocess.Popen[bytes]:
    parsed = Command.parse(command)
    if parsed is None or kwargs:
        log.info(
            "furcate: this DDP rank starts as a new interpreter: Lightning's command %s is not "
            "`%s <script>` or `%s -m <module>`.",
            list(command), sys.executable, sys.executable,
        )  # fmt: skip
        return subprocess.Popen(command, env=env, cwd=cwd, **kwargs)
    return start_rank(parsed, env, cwd)


def cold_start_reason() -> str | None:
    """Why a rank cannot be forked from this process now, or None where it can."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return "ranks are forked on Linux only"
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        for name in ("cuda", "xpu"):
            started = getattr(getattr(torch, name, None), "is_initialized", None)
            if started is not None and started():
                return f"{name.upper()} is initialised in the job's process: a fork cannot use it"
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return "the job's process has a torch.distributed process group already"
    others = _threads_python_did_not_start()
    if others is None:
        return "the job's threads cannot be read (/proc/self/task)"
    if others:
        return (
            f"{others} thread(s) that Python did not start run in the job's process (OpenMP's "
            "pool, after a parallel torch op, or a library's): a fork would wait forever on "
            "what they hold"
        )
    return None


def _threads_python_did_not_start() -> int | None:
    """How many of this process's threads are not Python's, or None where that is unknown.
    Python's own do no harm to a fork that touches nothing of theirs (the new interpreter's
    streams, locks and connections are its own); a native one, e.g. OpenMP's worker, leaves a
    fork that uses it waiting for good."""
    try:
        tasks = {int(task) for task in os.listdir("/proc/self/task")}
    except OSError:
        return None
    python = {threading.get_native_id()}
    python |= {t.native_id for t in threading.enumerate() if t.native_id is not None}
    return len(tasks - python)


def start_rank(command: Command, env: Mapping[str, str] | None, cwd: str | None) -> RankProcess:
    """Fork a rank that runs ``command`` in ``env`` and ``cwd`` as a new interpreter would
    (``cold_start_reason`` said it can)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the rank would write what is buffered here a second time
    with warnings.catch_warnings():
        # Python 3.12+ warns of any fork in a process with threads; cold_start_reason has
        # made sure the other threads' locks are never needed in the rank
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        run_as_interpreter(command, env, cwd)
    return RankProcess(pid, command.argv)


class RankProcess:
    """A rank forked from this process, with the ``Popen`` calls Lightning makes of its ranks
    (its process observer's ``poll``/``returncode``/``send_signal``, the launcher's ``kill``
    and ``send_signal``), and ``wait``, ``terminate``, ``kill`` as ``Popen`` has them.

    ``returncode`` is None while it runs, its exit status once reaped, ``-N`` when signal N
    ended it; safe to use from Lightning's observer thread and the main thread at once.
    """

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None  # inherited, as Lightning's Popen has them
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit status if it has ended (reaped now), else None."""
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): as Popen does
                    self.returncode = 0
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end; its exit status.

        Raises:
            subprocess.TimeoutExpired: It still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(_WAIT_STEP_S)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal it, unless it has ended (its pid may be another process's by now)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<RankProcess: pid {self.pid}, returncode {self.returncode}>"
