"""One Ray slot: a long-lived actor that keeps furcate's warm fork server and forks each job.

    RayTransport ──run(Start)──► SlotActor (a Ray worker, holds the slot's GPU share)
                                    └─► ForkServerClient ─► fork server ─► fresh job process
                 ◄─ forked(key) ─── (pid, fork time) the moment the job's process exists
                 ◄─ SlotResult ──── waits for the job's exit, reads its result file

Ray's own fresh worker per task (``max_calls=1``) costs seconds; a fork from the warm server
costs milliseconds and still gives every job a fresh process. Ray sets ``CUDA_VISIBLE_DEVICES``
for the actor; the fork server and its jobs inherit it. If the actor dies, its fork server's
socket closes and the server stops its jobs, so none outlives the slot.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.execution.forkserver import ForkServerClient
from furcate_hydra.execution.forkserver.job_start import ResultFiles
from furcate_hydra.execution.forkserver.protocol import Exited, Start, Started, StartFailed
from furcate_hydra.execution.slot_env import VISIBLE_DEVICES, cuda_env

__all__ = ["NodeInfo", "SlotActor", "SlotResult"]


@dataclass(frozen=True)
class NodeInfo:
    """Where a slot actor runs, for logs and for crash reasons."""

    node_id: str
    ip: str
    pid: int
    cuda_visible_devices: str | None
    server_start_s: float

    def __str__(self) -> str:
        return f"node {self.ip} ({self.node_id[:12]})"


@dataclass(frozen=True)
class SlotResult:
    """How one job ended in a slot; ``report`` is the job's pickled ChildReport, if any."""

    key: str
    pid: int | None
    started_at: float | None
    ended_at: float
    wait_status: int | None
    report: bytes | None
    start_error: str | None = None


class SlotActor:
    """The body of a slot actor; ``RayPool`` wraps it with ``ray.remote``.

    Threaded (Ray's ``max_concurrency``): ``run`` blocks for a job's whole life while
    ``forked``, ``kill`` and ``shutdown`` arrive on other threads; requests to the server are
    sent under one lock, and only ``run`` reads its events (one job at a time per slot).
    """

    def __init__(
        self,
        index: int,
        preload: list[str],
        context: bytes,
        cwd: str,
        sys_path: list[str],
        gpus: float,
    ) -> None:
        # The launcher's directory and import path, where this node has them (one machine, or
        # a shared filesystem): relative sweep dirs and the task's modules resolve as locally.
        if os.path.isdir(cwd):
            os.chdir(cwd)
        sys.path[:0] = [p for p in sys_path if p not in sys.path and os.path.exists(p)]
        # CUDA's view of the slot, as a local slot's: the fork server and its jobs inherit it
        env = cuda_env(None)
        if gpus:  # Ray set the actor's CUDA_VISIBLE_DEVICES: its GPUs, or its share of one
            del env[VISIBLE_DEVICES]
        os.environ.update(env)
        self.index = index
        self._lock = threading.Lock()
        self._kill_requested: dict[str, int] = {}
        # key -> (pid, fork time), or None for a job that ended without a process; each
        # entry is set once by run() and taken by forked()
        self._forks: dict[str, tuple[int, float] | None] = {}
        self._forked = threading.Condition()
        self._told: set[str] = set()  # keys whose run() has told forked() already
        self._results = ResultFiles(Path(tempfile.mkdtemp(prefix="furcate-ray-")))
        began = time.perf_counter()
        self._server = ForkServerClient(preload, context)
        self._start_s = time.perf_counter() - began

    def where(self) -> NodeInfo:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        # The address the node registered with, as `ray status` names it (Ray swaps a
        # loopback --node-ip-address for the machine's own).
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        ips = [n["NodeManagerAddress"] for n in nodes if n["NodeID"] == node_id]
        return NodeInfo(
            node_id=node_id,
            ip=ips[0] if ips else ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            pid=os.getpid(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            server_start_s=self._start_s,
        )

    def set_context(self, context: bytes) -> None:
        with self._lock:
            self._server.set_context(context)

    def forked(self, key: str) -> tuple[int, float] | None:
        """The job's pid and fork time, as soon as its process exists (None: it ended
        without one). Blocks until ``run`` knows; the pool asks it beside each ``run``, so
        a job's STARTED carries its pid as the local pool's does."""
        with self._forked:
            self._forked.wait_for(lambda: key in self._forks)
            return self._forks.pop(key)

    def run(self, start: Start) -> SlotResult:
        """Fork the job from the warm server and wait for it to exit."""
        try:
            return self._run(start)
        finally:
            self._tell_forked(start.key, None)  # no process came of it: forked() returns

    def _tell_forked(self, key: str, fork: tuple[int, float] | None) -> None:
        with self._forked:
            if key not in self._told:
                self._told.add(key)
                self._forks[key] = fork
                self._forked.notify_all()

    def _run(self, start: Start) -> SlotResult:
        with self._forked:  # a retry of the key: a new process to tell of
            self._told.discard(start.key)
        start = dataclasses.replace(start, result_path=str(self._results.path(start.key)))
        with self._lock:
            if start.key in self._kill_requested:
                return SlotResult(start.key, None, None, time.time(), None, None, "cancelled")
            self._server.start(start)
        pid = started_at = None
        while True:
            event = self._server.receive(timeout=None)
            if isinstance(event, Started) and event.key == start.key:
                pid, started_at = event.pid, event.started_at
                self._tell_forked(start.key, (pid, started_at))
                with self._lock:  # a kill that came while the job was being forked
                    signum = self._kill_requested.get(start.key)
                    if signum is not None:
                        self._server.kill(start.key, signum)
            elif isinstance(event, StartFailed) and event.key == start.key:
                return SlotResult(start.key, None, None, time.time(), None, None, event.error)
            elif isinstance(event, Exited) and event.key == start.key:
                report = self._results.take(start.key)
                self._kill_requested.pop(start.key, None)
                return SlotResult(
                    start.key, pid, started_at, event.ended_at, event.wait_status, report
                )

    def kill(self, key: str, signum: int) -> None:
        with self._lock:
            self._kill_requested[key] = signum
            self._server.kill(key, signum)

    def shutdown(self, grace_s: float) -> None:
        """Stop the running job (SIGTERM, SIGKILL after ``grace_s``) and the fork server."""
        with self._lock:
            self._server.shutdown(grace_s)
