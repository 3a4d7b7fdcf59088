"""The benchmarks' commands: an app's Hydra CLI (or any command) in a subprocess, timed, its
output captured, and the share of the machine's CPU that other work used meanwhile; and what
such runs share: the CPU time of the commands, an empty MLflow store to copy for each run.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness import OthersCpu

__all__ = ["ROOT", "Finished", "app_command", "children_cpu_s", "empty_store", "run_command"]

ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 30.0  # after a Ctrl-C at the timeout, the command's time to stop its jobs


def children_cpu_s() -> float:
    """CPU time of the commands run so far, with the fork servers and jobs they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def app_command(app: Path, overrides: Sequence[str], python: Sequence[str] = ()) -> list[str]:
    """``python [python...] app -m overrides...``: a multirun of the app through its CLI."""
    return [sys.executable, *python, str(app), "-m", *overrides]


@dataclass(frozen=True)
class Finished:
    """A command that ran: its exit status (None: stopped at its timeout), output and times."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    began: float  # wall clock, just before the start
    ended: float
    wall_s: float  # by the monotonic clock
    others_cpu_share: float  # of the machine's CPU, used by other processes meanwhile

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def check(self, what: str) -> Finished:
        """This run, or an error naming ``what`` with its exit status and the end of stderr."""
        if self.returncode != 0:
            raise RuntimeError(f"{what} exited with {self.returncode}:\n{self.stderr[-3000:]}")
        return self


def run_command(
    command: Sequence[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    log: Path | None = None,
    on_start: Callable[[int], None] | None = None,
    own_session: bool = False,
) -> Finished:
    """Run ``command`` to its end and capture its output (into ``log``, stderr merged, where
    given); ``on_start`` gets its pid. Past ``timeout_s`` it is killed, or, with
    ``own_session``, stopped as a user would stop it (Ctrl-C: the launcher stops its jobs and
    its MPS daemon; a kill ``STOP_GRACE_S`` later), as on a Ctrl-C of the benchmark, which a
    command in a session of its own does not get itself."""
    others, cpu_before = OthersCpu(), children_cpu_s()
    output = open(log, "wb") if log is not None else None  # noqa: SIM115 (closed below)
    began, clock = time.time(), time.perf_counter()
    try:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL if own_session else None,
            stdout=output or subprocess.PIPE,
            stderr=subprocess.STDOUT if output else subprocess.PIPE,
            start_new_session=own_session,
        )
        if on_start is not None:
            on_start(process.pid)
        returncode: int | None
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
            returncode = process.returncode
        except subprocess.TimeoutExpired:
            _stop(process, own_session)
            stdout, stderr = process.communicate()
            returncode = None
        except KeyboardInterrupt:
            _stop(process, own_session)
            raise
    finally:
        if output is not None:
            output.close()
    wall, ended = time.perf_counter() - clock, time.time()
    return Finished(
        list(command),
        returncode,
        (stdout or b"").decode(errors="replace"),
        (stderr or b"").decode(errors="replace"),
        began,
        ended,
        wall,
        others.share(children_cpu_s() - cpu_before),
    )


def _stop(process: subprocess.Popen[bytes], own_session: bool) -> None:
    if not own_session:  # as subprocess.run does; a Ctrl-C has reached the command as well
        process.kill()
        process.wait()
        return
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def empty_store(path: Path) -> Path:
    """An MLflow sqlite store at ``path`` with its schema made and no run, to copy for each
    command; made by a child process, so this one does not import MLflow."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; from mlflow.tracking import MlflowClient; "
        code += "MlflowClient('sqlite:///' + sys.argv[1]).search_experiments()"
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True)
    return path
