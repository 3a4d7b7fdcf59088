"""A stand-in for a job's process that starts ranks warm (``tests/test_warm_ranks.py``).

    python tests/rank_fork_parent.py SPEC.json

It imports what a job's process has (Hydra, furcate), then forks: the fork plays the job's
process, as a fork server's job is a fork (no thread of the imports is left in it). The job
takes on state a rank must not carry (a Python signal handler, an exit handler, Hydra
initialised, a context variable set, an environment variable, its own module with an OmegaConf
resolver), then does what SPEC asks:

  {"runs": [{"command": [...], "env": {...} | null, "cwd": str | null, "out": path,
             "err": path, "ready": path | null, "signal": "SIGTERM" | null, "cold": bool}],
   "reasons": ["none" | "python_thread" | "native_thread" | "cuda", ...],
   "job_imports": [module, ...], "app_dir": path, "result": path}

Each run: rank started with ``start_rank``, or with ``cold`` as Lightning starts it (``Popen``),
its stdout/stderr into ``out``/``err``; with a
``signal``, once ``ready`` exists: ``poll`` and a short ``wait`` first, then the signal. Each
reason: ``cold_start_reason`` with that made true. The result (JSON): per run its returncode
and pid, per reason what ``cold_start_reason`` said.
"""

from __future__ import annotations

import atexit
import decimal
import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

from hydra import initialize

from furcate_hydra.job_process.fresh_interpreter import Command
from furcate_hydra.job_process.warm_ranks import RankProcess, cold_start_reason, start_rank

_HELD: list[types.ModuleType] = []


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    code = 1
    try:
        Path(spec["result"]).write_text(json.dumps(job(spec)))
        code = 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def job(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's process: its own state, then the runs and the reasons."""
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a rank has no handler of its job
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # an ignored signal stays ignored (exec)
    marker = Path(spec["result"]).with_suffix(".parent-atexit")
    atexit.register(marker.write_text, "the job's exit handler ran in a rank")
    decimal.getcontext().prec = 5  # a context variable: a rank starts with an empty context
    os.environ["JOB_ONLY"] = "1"
    initialize(version_base=None)  # Hydra initialised, as in a job
    sys.path.insert(0, spec["app_dir"])
    importlib.import_module("app_parts")  # the app's own module, with its resolver
    # what else the job's task imported, held as the task's module holds its imports
    _HELD.extend(importlib.import_module(name) for name in spec.get("job_imports", []))
    runs = [_run(run) for run in spec.get("runs", [])]
    reasons = {name: _reason(name) for name in spec.get("reasons", [])}
    return {"runs": runs, "reasons": reasons}


def _run(run: dict[str, Any]) -> dict[str, Any]:
    command = Command.parse(run["command"])
    assert command is not None, run["command"]
    saved = os.dup(1), os.dup(2)
    with open(run["out"], "wb") as out, open(run["err"], "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            rank: RankProcess | subprocess.Popen[bytes]
            if run.get("cold"):  # what Lightning's own launcher does, from the same process
                rank = subprocess.Popen(run["command"], env=run.get("env"), cwd=run.get("cwd"))
            else:
                rank = start_rank(command, run.get("env"), run.get("cwd"))
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    result: dict[str, Any] = {"pid": rank.pid}
    if run.get("signal"):
        result.update(_signalled(rank, Path(run["ready"]), signal.Signals[run["signal"]]))
    result["returncode"] = rank.wait(timeout=120)
    rank.kill()  # ended: no signal sent, no error
    result["poll_after"] = rank.poll()
    return result


def _signalled(
    rank: RankProcess | subprocess.Popen[bytes], ready: Path, signum: signal.Signals
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    running = rank.poll()
    try:
        rank.wait(timeout=0.05)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    rank.send_signal(signum)
    return {"poll_running": running, "wait_timed_out": timed_out}


def _reason(name: str) -> str | None:
    """``cold_start_reason`` with ``name`` true in this process, then undone."""
    if name == "python_thread":
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            return cold_start_reason()
        finally:
            stop.set()
            thread.join()
    if name == "native_thread":  # faulthandler's watchdog is a C thread
        faulthandler.dump_traceback_later(600)
        time.sleep(0.1)  # started
        try:
            return cold_start_reason()
        finally:
            faulthandler.cancel_dump_traceback_later()
    if name == "cuda":  # torch loaded, its CUDA started (no GPU needed)
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)  # type: ignore[attr-defined]
        sys.modules["torch"] = torch
        try:
            return cold_start_reason()
        finally:
            del sys.modules["torch"]
    return cold_start_reason()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
