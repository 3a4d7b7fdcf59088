"""The slot actors of a Ray pool: started together, replaced one by one, stopped together.

start_all() ─► one SlotActor per slot, each with the slot's Ray resources, started in
               parallel and waited for (its fork server has imported ``preload``)
replace(i)  ─► a dead slot's new actor, started in the background: ``starting`` refs
               resolve in the pool's wait (``on_started``), or are given up (``overdue``)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

from furcate_hydra.errors import ExecutorBrokenError
from furcate_hydra.execution.forkserver.client import HEAVY_MODULES
from furcate_hydra.ray_backend.cluster import RaySlotPlan
from furcate_hydra.ray_backend.slot_actor import NodeInfo, SlotActor

__all__ = ["SlotActors"]

log = logging.getLogger(__name__)

# A slot actor runs one job and takes forked/kill/shutdown/set_context calls meanwhile.
_ACTOR_CONCURRENCY = 6


class SlotActors:
    """One actor per slot of ``plan`` and where each runs (``nodes``)."""

    def __init__(
        self,
        ray: Any,
        plan: RaySlotPlan,
        preload: tuple[str, ...] | None,
        job_imports: tuple[str, ...],
        context: bytes,
        start_timeout_s: float,
    ) -> None:
        self._ray = ray
        self.plan = plan
        self.context = context  # what a new actor starts with
        self.start_timeout_s = start_timeout_s
        # unset: the heavy modules the launcher has loaded (its task's imports), as a new
        # interpreter's fork server on this machine would import them
        self._preload = [
            *(preload if preload is not None else (m for m in HEAVY_MODULES if m in sys.modules)),
            *job_imports,
        ]
        self._class = ray.remote(SlotActor).options(
            num_gpus=plan.gpus_per_slot,
            num_cpus=plan.cpus_per_slot,
            max_concurrency=_ACTOR_CONCURRENCY,
            max_restarts=0,
        )
        self._actors: list[Any] = [self._new(slot.index) for slot in plan.slots]
        self.nodes: dict[int, NodeInfo] = {}  # slot -> where its running actor is
        # a dead slot's new actor: ObjectRef of its where() -> (slot, deadline to start)
        self.starting: dict[Any, tuple[int, float]] = {}

    def __getitem__(self, index: int) -> Any:
        return self._actors[index]

    def start_all(self) -> list[int]:
        """Wait until every slot's actor runs its warm server; returns the slots.

        Raises:
            ExecutorBrokenError: an actor could not be placed in time, or failed to start.
        """
        refs = {actor.where.remote(): i for i, actor in enumerate(self._actors)}
        ready, late = self._ray.wait(
            list(refs), num_returns=len(refs), timeout=self.start_timeout_s
        )
        if late:
            self.kill_all()
            raise ExecutorBrokenError(
                f"{len(late)} of {len(refs)} Ray slot actors did not start within "
                f"{self.start_timeout_s:g} s: the cluster lacks the resources one slot asks for "
                f"({self.plan.gpus_per_slot:g} GPU, {self.plan.cpus_per_slot:g} CPU), or "
                "they are held by other work. Lower hydra.launcher.max_workers, or raise "
                "hydra.launcher.ray.start_timeout_s."
            )
        for ref in ready:
            try:
                self.nodes[refs[ref]] = self._ray.get(ref)
            except Exception as exc:
                self.kill_all()
                raise ExecutorBrokenError(
                    f"A Ray slot actor could not start its fork server: {exc}"
                ) from None
        return sorted(self.nodes)

    def replace(self, index: int) -> None:
        """Start a new actor for a slot whose actor died, without waiting for it: the other
        slots go on, and a node that is gone may leave no room for it."""
        self.nodes.pop(index, None)
        with contextlib.suppress(Exception):
            self._ray.kill(self._actors[index])
        self._actors[index] = self._new(index)
        ref = self._actors[index].where.remote()
        self.starting[ref] = (index, time.monotonic() + self.start_timeout_s)

    def on_started(self, ref: Any) -> tuple[int, bool]:
        """A new actor's ``where()`` resolved: its slot, and whether the actor runs."""
        index, _ = self.starting.pop(ref)
        try:
            self.nodes[index] = self._ray.get(ref)
        except Exception as exc:
            log.warning("furcate: slot %d could not start a new Ray actor: %s", index, exc)
            return index, False
        return index, True

    def overdue(self) -> list[int]:
        """Slots whose new actor found no room within ``start_timeout_s``: given up."""
        now = time.monotonic()
        given_up = []
        for ref, (index, deadline) in list(self.starting.items()):
            if now > deadline:
                del self.starting[ref]
                log.warning(
                    "furcate: slot %d got no new Ray actor within %g s (no room left in the "
                    "cluster?); it is given up",
                    index,
                    self.start_timeout_s,
                )
                with contextlib.suppress(Exception):
                    self._ray.kill(self._actors[index])
                given_up.append(index)
        return given_up

    def set_context(self, context: bytes) -> None:
        """Every running actor gets it; a new one is started with it."""
        self.context = context
        calls = [self._actors[index].set_context.remote(context) for index in self.nodes]
        if calls:
            # A dead actor does not stop this: its job's result says so, and its slot gets
            # a new actor, started with this context.
            self._ray.wait(calls, num_returns=len(calls), timeout=self.start_timeout_s)

    def stop_all(self, grace_s: float) -> None:
        """Stop every actor's job (SIGTERM, SIGKILL after ``grace_s``) and fork server."""
        with contextlib.suppress(Exception):  # a dead actor or node: killed below anyway
            stops = [actor.shutdown.remote(grace_s) for actor in self._actors]
            self._ray.wait(stops, num_returns=len(stops), timeout=grace_s + 5.0)
        self.kill_all()

    def kill_all(self) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)

    def _new(self, index: int) -> Any:
        return self._class.remote(
            index,
            self._preload,
            self.context,
            os.getcwd(),
            list(sys.path),
            self.plan.gpus_per_slot,
        )
