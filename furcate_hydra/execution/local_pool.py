"""The local executor: slots on this machine, each job a fresh process forked from a warm server.

    submit(job) ──► queue ──► free slot? ──► Start(slot) ──► fork server ──► job process
                                │ no: ahead of the slots, one per slot ──► Start(no slot):
                                │     forked now, set up, waiting at its gate
                                ▼                                           │ a job exits
    wait_any() ◄── Job ◄── result file / exit status ◄── Exited ◄─────┘ its slot goes to
                                  └── slot freed (or, in the server, handed to the oldest job
                                      waiting at its gate: Started(after=...)), next dispatched

The fork server starts (``start``) when the first job needs it, or before, so that it loads
while the caller does other work (``wait_ready`` then waits for it).

``LocalTransport`` is this machine's ``Transport``: slots, the fork server, result files. The
job lifecycle (queue, retries, preemption, cancellation, the broken state when the fork server
dies, events) is ``JobPool``'s, which ``LocalPool`` is over it. Nothing here imports Hydra.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from furcate_hydra import env_vars
from furcate_hydra.errors import ForkServerError
from furcate_hydra.execution.forkserver import ForkServerClient
from furcate_hydra.execution.forkserver.client import ConsoleOutput, start_server
from furcate_hydra.execution.forkserver.job_start import ResultFiles, job_start
from furcate_hydra.execution.forkserver.protocol import (
    ChildReport,
    Exited,
    Imported,
    Placement,
    Preloaded,
    StartFailed,
    Unused,
    WarmContext,
)
from furcate_hydra.execution.forkserver.protocol import Started as ServerStarted
from furcate_hydra.execution.gpu.mps import MpsDaemon, start_mps
from furcate_hydra.execution.gpu.packing import GpuPacking
from furcate_hydra.execution.job import Job
from furcate_hydra.execution.job_pool import JobPool
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.server_imports import ServerImports
from furcate_hydra.execution.slot_book import SlotBook
from furcate_hydra.execution.slot_env import VISIBLE_DEVICES
from furcate_hydra.execution.slots import Slot, SlotPlan
from furcate_hydra.execution.transport import (
    Broken,
    Ended,
    Freed,
    Placed,
    Report,
    Started,
    Transport,
    TransportBroken,
    load_report,
)

__all__ = ["LocalPool", "LocalTransport"]

log = logging.getLogger(__name__)


class LocalPool(JobPool):
    """Runs jobs on the slots of a plan, one fresh process per job."""

    def __init__(
        self,
        plan: SlotPlan,
        context: bytes,
        options: PoolOptions,
        output: ConsoleOutput | None = None,
        warm: Callable[[], WarmContext | None] | None = None,
        packing: GpuPacking | None = None,
        sweep_dir: Path | None = None,
    ) -> None:
        """``context``: what every job starts from, pickled. ``warm``: asked when the server
        starts, for what a fork of this process starts jobs from, as it is at the fork (so it
        must not hold state a later ``set_context`` changes); None, or it answers None: start
        a new interpreter. ``output``: where job output echoed to the console goes (default:
        the launcher's stdout and stderr). ``packing``: with ``jobs_per_gpu=auto``, how many of
        each GPU's slots are open. ``sweep_dir``: where an MPS daemon's pipe and logs go
        (``options.mps``); None: the runtime dir."""
        self.plan = plan
        self._local = LocalTransport(plan, context, options, output, warm, packing, sweep_dir)
        super().__init__(self._local, options, packing)

    @property
    def server_start_s(self) -> float:
        """Seconds from starting the fork server to its having loaded everything."""
        return self._local.ready_server().start_s

    @property
    def server_pid(self) -> int:
        return self._local.started_server().process.pid

    @property
    def server_forked(self) -> bool:
        """Whether the fork server is a fork of this process (else a fresh interpreter)."""
        return self._local.started_server().forked


class LocalTransport(Transport):
    """This machine's slots and the fork server that forks each job (see the module doc)."""

    name = "local slot pool"

    def __init__(
        self,
        plan: SlotPlan,
        context: bytes,
        options: PoolOptions,
        output: ConsoleOutput | None,
        warm: Callable[[], WarmContext | None] | None,
        packing: GpuPacking | None = None,
        sweep_dir: Path | None = None,
    ) -> None:
        self.plan = plan
        self.options = options
        self._context = context
        self._warm = warm
        self._output = output
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="furcate-"))
        self._results = ResultFiles(self._runtime_dir)
        self._sweep_dir = sweep_dir or self._runtime_dir
        self._mps: MpsDaemon | None = None
        self._server: ForkServerClient | None = None
        self._packing = packing
        self._slots = SlotBook(plan.slots, packing.capacity if packing is not None else None)
        self._jobs: dict[str, Job] = {}  # placed: on a slot, or ahead of one
        self._ahead: dict[str, Job] = {}  # forked ahead, waiting at their gates for a slot
        self._group_homes: dict[str, int | None] = {}  # a fused group's dir -> its slot
        # The server hands an ended job's slot to a job ahead at once, before the launcher
        # hears of the end: on a shared GPU that would keep a slot an out-of-memory closed.
        self._shared = any(count > 1 for count in plan.slots_per_gpu().values())
        self._fork_ahead = options.fork_ahead and not (packing is not None and self._shared)
        self._imports = ServerImports(options.preload is None, options.lightning_layer)

    @property
    def slot_count(self) -> int:
        """Slots open now: a GPU under ``jobs_per_gpu=auto`` opens its plan's slots as its
        jobs' memory allows."""
        if self._packing is None:
            return len(self.plan.slots)
        return self._packing.open_slots()

    @property
    def idle_slots(self) -> int:
        return self._slots.free

    def describe(self) -> str:
        return self.plan.describe()

    def start(self) -> None:
        """Start the fork server, if not yet; it loads what it needs while this returns."""
        self.started_server()

    def wait_ready(self) -> None:
        """Start the fork server if needed and wait until it can fork jobs.

        Raises:
            ForkServerError: it could not load the task (its traceback says why).
        """
        self.ready_server()

    def set_context(self, context: bytes) -> None:
        if self._server is None:  # a new interpreter starts from it (a fork, from itself)
            self._context = context
        else:
            self._send(lambda: self.ready_server().set_context(context))

    def preload(self, modules: Sequence[str]) -> None:
        self._ask_server(self._imports.remembered(modules))

    @property
    def learned_imports(self) -> tuple[str, ...]:
        return tuple(self._imports.learned)

    def _ask_server(self, modules: list[str]) -> None:
        if modules:
            self._send(lambda: self.ready_server().preload(modules))

    def has_room(self) -> bool:
        # Free slots went to the jobs ahead first (``_offer``): one left is the queue's.
        return bool(self._slots.free) or (self._fork_ahead and len(self._ahead) < self.slot_count)

    def place(self, job: Job) -> Placed | None:
        """Have the server fork the job: on a free slot, or ahead of one."""
        # a fused group's jobs go to the seats of one slot: its first took the least busy
        group = job.env.get(env_vars.FUSE_DIR)
        home = self._group_homes.get(group) if group else None
        slot = self._slots.take_free(home) if self._slots.free else None
        if group and slot is not None:
            self._group_homes[group] = slot.home
        self._jobs[job.key] = job
        if slot is None:
            self._ahead[job.key] = job
        else:
            self._slots.hold(job.key, slot)
        placement = None if slot is None else self._placement(slot)
        result_path = str(self._results.path(_result_name(job)))
        start = job_start(job, placement, result_path, self.options.echo_output)
        self._send(lambda: self.ready_server().start(start))
        return None if slot is None else Placed(slot)

    def stop(self, job: Job) -> None:
        self._send(lambda: self.ready_server().kill(job.key, signal.SIGTERM))

    def poll(self, timeout: float) -> list[Report]:
        """The server's next event (waiting up to ``timeout``) and every one already there."""
        reports: list[Report] = []
        try:
            event = self._receive(timeout)
            while event is not None:
                reports += self._on_event(event)
                event = self._receive(0)
            self._offer()
        except TransportBroken as exc:
            reports.append(Broken(exc.reason))
        return reports

    def abandon(self) -> None:
        """Its jobs run in sessions of their own, so they outlive the server: stop them, as it
        would have. Those forked ahead exit by themselves: their gates closed with it."""
        for key, job in self._jobs.items():
            if key not in self._ahead and job.pid is not None:
                _kill_group(job.pid)
        self._jobs.clear()
        self._ahead.clear()
        self._slots.clear()

    def close(self) -> None:
        """Stop every job's process group and the fork server."""
        if self._server is not None and self._server.ready is None:
            # still loading (seconds of imports), with no job: it would not read a Shutdown
            self._server.terminate(wait_s=0.0)
        elif self._server is not None:
            self._server.shutdown(self.options.stop_grace_s)
        if self._mps is not None:
            self._report_mps_faults()
            self._mps.stop()  # after its jobs: none of them is left to lose its server
        shutil.rmtree(self._runtime_dir, ignore_errors=True)

    # -- the fork server -----------------------------------------------------------------

    def started_server(self) -> ForkServerClient:
        if self._server is None:
            self._start_mps()  # before any job can make a CUDA context
            preload, output = self.options.preload, self._output
            warm = self._warm() if self._warm is not None else None
            self._server = start_server(
                preload, self._context, warm, output, self.options.job_imports
            )
        return self._server

    def ready_server(self) -> ForkServerClient:
        server = self.started_server()
        server.wait_ready()
        return server

    def _receive(self, timeout: float) -> object | None:
        if self._server is None:
            return None
        try:
            return self._server.receive(timeout=timeout)
        except ForkServerError as exc:
            raise TransportBroken(str(exc)) from None

    def _send(self, request: Callable[[], object]) -> None:
        try:
            request()
        except OSError as exc:  # BrokenPipeError and kin: the server is gone
            raise TransportBroken(f"the fork server stopped taking requests ({exc!r})") from None

    def _on_event(self, event: object) -> list[Report]:
        if isinstance(event, ServerStarted):
            placed = None
            if self._ahead.pop(event.key, None) is not None:  # it leaves its gate for a slot
                if event.after is not None:  # the slot of a job that ended
                    slot = self._slots.hand_on(event.after, event.key)
                else:
                    slot = self._slots.accept(event.slot, event.key)
                placed = Placed(slot)
            return [Started(event.key, event.pid, event.started_at, placed)]
        if isinstance(event, Unused):  # the job it was offered to has gone meanwhile
            self._slots.decline(event.slot)
            return [Freed()]
        if isinstance(event, StartFailed):
            self._end(event.key)
            return [Ended(event.key, start_error=event.error)]
        if isinstance(event, Preloaded):
            self._imports.imported(event)
            return []
        if isinstance(event, Imported):  # a job, still running, has just imported them
            self._ask_server(self._imports.seen(event.modules))
            return []
        elif isinstance(event, Exited) and (job := self._end(event.key)) is not None:
            self._report_mps_faults()
            report = self._read_report(job)
            if report is not None:
                self._ask_server(self._imports.seen(report.imported))
            return [Ended(job.key, report, event.wait_status, event.ended_at)]
        return []

    def _release(self, placement: Placement) -> None:
        self.ready_server().release(placement)

    def _end(self, key: str) -> Job | None:
        """A job that ended: it ran on a slot (free now, unless handed on), or never left its
        gate."""
        self._ahead.pop(key, None)
        self._slots.release(key)
        return self._jobs.pop(key, None)

    def _offer(self) -> None:
        """Free slots go to the jobs forked ahead first (the server picks the oldest)."""
        while self._slots.free and len(self._ahead) > self._slots.offered:
            placement = self._placement(self._slots.offer())
            self._send(partial(self._release, placement))

    # -- MPS ------------------------------------------------------------------------------

    def _start_mps(self) -> None:
        """NVIDIA's MPS daemon, where ``options.mps`` asks and a GPU runs several jobs."""
        per_gpu = self.plan.slots_per_gpu()
        self._mps = start_mps(self.options.mps, list(per_gpu), self._shared, self._sweep_dir)

    def _placement(self, slot: Slot) -> Placement:
        env = slot.env()
        if self._mps is not None and slot.device is not None:
            # under furcate's daemon a job names its GPU as the daemon numbers them
            env.update(self._mps.env())
            env[VISIBLE_DEVICES] = self._mps.visible_device(slot.device)
        return Placement(slot.index, env, slot.cpus, slot.threads)

    def _report_mps_faults(self) -> None:
        """A fault MPS logged takes down the jobs sharing its GPU: say so, never silently."""
        if self._mps is None:
            return
        for line in self._mps.faults():  # each says where, and which jobs it may have taken
            log.warning("%s", line)

    def _read_report(self, job: Job) -> ChildReport | None:
        try:
            data = self._results.take(_result_name(job))
        except OSError as exc:
            return ChildReport(error=f"the job's result could not be read: {exc!r}")
        return None if data is None else load_report(data)


def _result_name(job: Job) -> str:
    # id() is unique while the job is held here, and a job is held until it is handed back.
    return f"{id(job):x}-{job.attempts}"


def _kill_group(pid: int) -> None:
    # A job is its own session and process group (pgid == pid); its DataLoader workers too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
