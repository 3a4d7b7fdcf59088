"""Timers inside one launcher: where its time goes per job, with no product code changed.

``instrument(launcher)`` sets timing wrappers as attributes of the objects the launcher's
session uses (the session, its ``SweepComposer``, ``RunLedger``, ``RunStore``, MLflow client,
``LocalPool`` executor and fork-server client), so every call the launcher makes through them
is timed, wall and CPU of the calling thread, under the timed call it was made from. Nothing
global is patched. A method the launcher no longer has is reported as missing; a missing one among
``REQUIRED`` (the figures the benchmark reports) stops the benchmark with its name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra_plugins.furcate_launcher.furcate_launcher import FurcateLauncher

__all__ = ["REQUIRED", "JobTimes", "Timers", "cpu_seconds", "instrument"]

# The methods timed, per object the session holds (its attribute path from the session); each
# is labelled ``<last attribute>.<method>``: ``composer.compose``, ``client.set_tag``.
TARGETS: dict[str, tuple[str, ...]] = {
    "session": ("submit_batch", "refresh_context", "wait_any"),
    "session.handler": ("compose", "finished"),
    "session.composer": ("compose", "_hydra", "_shortcut"),
    "session.ledger": ("prepare", "claim", "open", "started", "record", "flush"),
    "session.ledger.store": (
        "decide",
        "start_sweep",
        "claim",
        "confirm",
        "finish_job_run",
        "log_artifacts",
        "latest_metrics",
        "log_sweep_artifact",
    ),
    "session.ledger.store.client": (
        "create_run",
        "log_batch",
        "update_run",
        "delete_run",
        "set_tag",
        "set_terminated",
        "get_run",
        "search_runs",
        "log_artifact",
    ),
    "session.executor": ("submit", "wait_any"),
    "session.executor._transport._server": ("receive", "start"),
}
REQUIRED = (
    "composer.compose",
    "ledger.prepare",
    "ledger.claim",
    "ledger.open",
    "ledger.record",
    "ledger.flush",
    "store.decide",
    "store.claim",
    "store.confirm",
    "store.finish_job_run",
    "executor.submit",
    "executor.wait_any",
)


@dataclass
class Timer:
    calls: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # of the calling thread: well below ``seconds`` means it waited


@dataclass
class Timers:
    """Timing wrappers; a call made inside another timed call is counted under it."""

    timers: dict[tuple[str, ...], Timer] = field(default_factory=dict)
    wrapped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    _stack: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def wrap(
        self,
        owner: Any,
        name: str,
        label: str,
        observe: Callable[[tuple[Any, ...]], None] | None = None,
    ) -> None:
        """Time ``owner.name`` (an instance's method) as ``label``; ``observe(args)`` after."""
        original = getattr(owner, name, None)
        if not callable(original):
            self.missing.append(label)
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append(label)
            path = tuple(self._stack)
            began, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                timer = self.timers.setdefault(path, Timer())
                timer.calls += 1
                timer.seconds += time.perf_counter() - began
                timer.cpu += time.thread_time() - cpu
                self._stack.pop()
                if observe is not None:
                    observe(args)

        own = vars(owner).get(name) if hasattr(owner, "__dict__") else None
        setattr(owner, name, timed)
        self.wrapped.append(label)
        self._undo.append(
            (lambda: setattr(owner, name, own)) if own is not None else lambda: delattr(owner, name)
        )

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def total(self, label: str, top_level: bool = False) -> Timer:
        """All calls of ``label`` (only those made from outside any timed call if asked)."""
        out = Timer()
        for path, t in self.timers.items():
            if path[-1] == label and (len(path) == 1 or not top_level):
                out.calls += t.calls
                out.seconds += t.seconds
                out.cpu += t.cpu
        return out

    def top_level_seconds(self) -> float:
        return sum(t.seconds for path, t in self.timers.items() if len(path) == 1)

    def per_job_ms(self, jobs: int) -> dict[str, dict[str, float]]:
        """``parent / child`` labels, children after their parent, in order of first call;
        ``self_ms_per_job`` is a call's time outside the timed calls it made."""
        first = {path: i for i, path in enumerate(self.timers)}

        def order(path: tuple[str, ...]) -> list[int]:
            return [first.get(path[: i + 1], len(first)) for i in range(len(path))]

        out: dict[str, dict[str, float]] = {}
        for path, t in sorted(self.timers.items(), key=lambda item: order(item[0])):
            children = sum(
                c.seconds
                for p, c in self.timers.items()
                if len(p) == len(path) + 1 and p[:-1] == path
            )
            row = {
                "ms_per_job": round(t.seconds * 1000 / jobs, 2),
                "cpu_ms_per_job": round(t.cpu * 1000 / jobs, 2),
                "calls": t.calls,
            }
            if children:
                row["self_ms_per_job"] = round((t.seconds - children) * 1000 / jobs, 2)
            out[" / ".join(path)] = row
        return out


@dataclass
class JobTimes:
    """One job, wall-clock: forked, task entered, process exited, result recorded here."""

    forked: float
    entered: float
    exited: float
    handled: float


def instrument(launcher: FurcateLauncher, timers: Timers, jobs: list[JobTimes]) -> None:
    """Timers on the objects this launcher's session uses (warming the session up: the fork
    server, and the store when recording); each recorded job's times go to ``jobs``."""
    session = launcher.session()
    session.warm_up()

    def note(args: tuple[Any, ...]) -> None:
        job, job_return = args
        value = job_return._return_value if job_return.status.name == "COMPLETED" else None
        entered = value.get("entered_at") if isinstance(value, dict) else None
        jobs.append(JobTimes(job.started_at, entered or job.started_at, job.ended_at, time.time()))

    for where, names in TARGETS.items():
        owner: Any = session
        prefix = where.split(".")[-1].lstrip("_")
        for attribute in where.split(".")[1:]:
            if owner is not None and not hasattr(owner, attribute):
                timers.missing += [f"{prefix}.{name}" for name in names]
            owner = getattr(owner, attribute, None)
        if owner is None:  # moved (reported above), or not in use: no store when not recording
            continue
        for name in names:
            label = f"{prefix}.{name}"
            timers.wrap(owner, name, label, note if label == "ledger.record" else None)
    recording = getattr(getattr(session, "ledger", None), "store", None) is not None
    required = [r for r in REQUIRED if recording or not r.startswith("store.")]
    if lost := [r for r in required if r in timers.missing]:
        timers.restore()
        raise RuntimeError(
            f"the launcher no longer has {', '.join(lost)}: update bench/instrument.py"
        )


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of its children it has waited for (user + system)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
