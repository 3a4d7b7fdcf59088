"""The Ray executor: the shared job lifecycle (``JobPool``) over one warm slot actor per slot.

    place(job) ──► a free slot ──► actor.run(Start) ──► fork server ──► job process
      Started (pid) ◄── actor.forked(key) ◄──────────────────────────────┘ forked
      Ended ◄── SlotResult (result file, exit status) ◄───────────────────┘ exits
            ◄── the actor (or its node) died: Ended(died=...), the slot gets a new actor

The launcher's side of a job is the same as with ``LocalPool``: its dirs, logs and progress
file are paths the job writes (on one machine, or on a filesystem every node mounts), its run
is created by the launcher, its value comes back pickled. Retries, preemption, cancellation and
the broken state (no slot left) are ``JobPool``'s. Nothing here imports Hydra.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from typing import Any

from furcate_hydra.errors import first_line
from furcate_hydra.execution.forkserver.job_start import job_start
from furcate_hydra.execution.forkserver.protocol import Placement
from furcate_hydra.execution.job import Job
from furcate_hydra.execution.job_pool import JobPool
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.slot_env import slot_env
from furcate_hydra.execution.transport import (
    Broken,
    Ended,
    Freed,
    Placed,
    Report,
    Started,
    Transport,
    load_report,
)
from furcate_hydra.ray_backend.actors import SlotActors
from furcate_hydra.ray_backend.cluster import RaySlotPlan
from furcate_hydra.ray_backend.slot_actor import NodeInfo, SlotResult

__all__ = ["RayPool", "RayTransport"]

log = logging.getLogger(__name__)


class RayPool(JobPool):
    """Runs jobs on Ray slot actors, one fresh forked process per job (see the module doc)."""

    def __init__(
        self,
        plan: RaySlotPlan,
        context: bytes,
        options: PoolOptions,
        ray: Any,
        start_timeout_s: float,
        owns_ray: bool,
    ) -> None:
        """``ray``: the connected ``ray`` module; ``owns_ray``: disconnect it on ``close``."""
        self.plan = plan
        self._ray_slots = RayTransport(plan, context, options, ray, start_timeout_s, owns_ray)
        self.start_s = self._ray_slots.start_s
        super().__init__(self._ray_slots, options)

    @property
    def nodes(self) -> dict[int, NodeInfo]:
        """Where each slot's actor runs now."""
        return dict(self._ray_slots.actors.nodes)


class RayTransport(Transport):
    """Slots as Ray actors, each forking its jobs from its own warm server; the actors start
    with the transport (its plan joined the cluster already)."""

    name = "Ray slot pool"

    def __init__(
        self,
        plan: RaySlotPlan,
        context: bytes,
        options: PoolOptions,
        ray: Any,
        start_timeout_s: float,
        owns_ray: bool,
    ) -> None:
        self.plan = plan
        self.options = options
        self._ray = ray
        self._owns_ray = owns_ray
        self.actors = SlotActors(
            ray, plan, options.preload, options.job_imports, context, start_timeout_s
        )
        self._placed: dict[str, tuple[Job, int]] = {}  # job key -> (job, slot)
        self._refs: dict[Any, str] = {}  # ObjectRef of a slot's run() -> job key
        # ObjectRef of a slot's forked() -> (job key, attempt): Started once it resolves
        self._forks: dict[Any, tuple[str, int]] = {}
        began = time.perf_counter()
        self._free: list[int] = self.actors.start_all()
        self.start_s = time.perf_counter() - began

    @property
    def slot_count(self) -> int:
        return len(self.plan.slots)

    @property
    def idle_slots(self) -> int:
        return len(self._free)

    def describe(self) -> str:
        ips = sorted({info.ip for info in self.actors.nodes.values()})
        return f"{self.plan.describe()}; actors on {', '.join(ips) or 'no node yet'}"

    def start(self) -> None:
        """Nothing to do: unlike the local pool, the slot actors start with the pool (its plan
        joined the cluster already, and Ray starts actors in seconds, not per job)."""

    def wait_ready(self) -> None:
        """Nothing to wait for: the pool waited for its actors when it was made."""

    def set_context(self, context: bytes) -> None:
        self.actors.set_context(context)

    def has_room(self) -> bool:
        return bool(self._free)

    def place(self, job: Job) -> Placed:
        index = self._free.pop(0)
        slot = self.plan.slots[index]
        # Ray sets CUDA_VISIBLE_DEVICES in the actor: as many GPUs as asked, or one shared
        env = slot_env(index, math.ceil(self.plan.gpus_per_slot), slot.threads)
        # Ray gives CPU counts, not cores: threads follow, nothing pinned
        placement = Placement(index, env, None, slot.threads)
        # the result file is the actor's own, on its node
        start = job_start(job, placement, "", self.options.echo_output)
        self._placed[job.key] = (job, index)
        actor = self.actors[index]
        self._refs[actor.run.remote(start)] = job.key
        self._forks[actor.forked.remote(job.key)] = (job.key, job.attempts)
        node = self.actors.nodes.get(index)
        return Placed(slot, node.ip if node is not None else None)

    def stop(self, job: Job) -> None:
        _, index = self._placed[job.key]
        self.actors[index].kill.remote(job.key, signal.SIGTERM)

    def poll(self, timeout: float) -> list[Report]:
        """Every fork, result and new actor that resolved, waiting up to ``timeout`` for one;
        then the slots whose new actor is overdue."""
        reports: list[Report] = []
        refs = [*self._forks, *self._refs, *self.actors.starting]
        ready: list[Any] = []
        if refs:
            ready, rest = self._ray.wait(refs, num_returns=1, timeout=timeout)
            if ready and rest:  # every other job that ended meanwhile, in the same call
                ready += self._ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        elif timeout:
            time.sleep(timeout)
        # a job's start before its end, when both came in this call
        for ref in sorted(ready, key=lambda r: r not in self._forks):
            if ref in self._forks:
                reports += self._on_forked(ref)
            elif ref in self.actors.starting:
                reports += self._on_actor_started(ref)
            elif ref in self._refs:
                reports += self._on_result(ref)
            if reports and isinstance(reports[-1], Broken):
                return reports
        for index in self.actors.overdue():
            reports += self._slot_lost(index)
            if reports and isinstance(reports[-1], Broken):
                return reports
        return reports

    def abandon(self) -> None:
        for key, (_, index) in self._placed.items():
            with contextlib.suppress(Exception):
                self.actors[index].kill.remote(key, signal.SIGKILL)
        self._placed.clear()
        self._refs.clear()
        self._forks.clear()
        self.actors.starting.clear()
        self._free = []

    def close(self) -> None:
        """Stop every job and slot actor; disconnect from Ray if the pool connected."""
        if not self._ray.is_initialized():
            # Ray's own atexit hook ran first and disconnected: the actors (owned by this
            # driver) died with the connection, and any Ray call now would start a new
            # local instance.
            return
        self.actors.stop_all(self.options.stop_grace_s)
        if self._owns_ray:
            with contextlib.suppress(Exception):
                self._ray.shutdown()

    # -- slots -------------------------------------------------------------------------

    def _on_actor_started(self, ref: Any) -> list[Report]:
        index, runs = self.actors.on_started(ref)
        if runs:
            self._free.append(index)
            return [Freed()]
        return self._slot_lost(index)

    def _slot_lost(self, index: int) -> list[Report]:
        """A slot is gone for good; with none left, the transport is broken."""
        if self._free or self._placed or self.actors.starting:
            return []
        return [
            Broken(
                f"no Ray slot is left: the last one (slot {index}) could not get a new actor; "
                "see `ray status` for the nodes and resources left"
            )
        ]

    # -- jobs ----------------------------------------------------------------------------

    def _on_forked(self, ref: Any) -> list[Report]:
        """The job's process exists on its node: Started, with its pid."""
        key, attempt = self._forks.pop(ref)
        placed = self._placed.get(key)
        if placed is None or placed[0].attempts != attempt:
            return []  # it ended (its result came first) or runs again
        try:
            fork: tuple[int, float] | None = self._ray.get(ref)
        except Exception:  # its actor died: the job's result says so
            return []
        return [] if fork is None else [Started(key, *fork)]

    def _on_result(self, ref: Any) -> list[Report]:
        key = self._refs.pop(ref)
        job, index = self._placed.pop(key)
        try:
            result: SlotResult = self._ray.get(ref)
        except Exception as exc:  # the actor or its node died, or its fork server did
            return [self._on_slot_death(key, index, exc)]
        self._free.append(index)
        reports: list[Report] = []
        if result.pid is not None:  # ended before its forked() came back: started first
            started_at = result.started_at or job.started_at or result.ended_at
            reports.append(Started(key, result.pid, started_at))
        report = None if result.report is None else load_report(result.report)
        where = str(self.actors.nodes.get(index, "an unknown node"))
        reports.append(
            Ended(key, report, result.wait_status, result.ended_at, result.start_error, None, where)
        )
        return reports

    def _on_slot_death(self, key: str, index: int, exc: Exception) -> Ended:
        node = self.actors.nodes.get(index)
        where = str(node) if node is not None else "an unknown node"
        why = (
            f"the Ray worker of slot {index} on {where} died while running the job "
            f"({first_line(exc)}); the node may be gone or out of memory (see `ray status` "
            "and the Ray logs of that node)"
        )
        log.warning("furcate: %s", why)
        self.actors.replace(index)
        return Ended(key, died=why)
