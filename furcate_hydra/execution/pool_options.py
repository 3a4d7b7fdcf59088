"""How a job pool treats its jobs: the ``hydra.launcher`` keys every backend's pool reads."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PoolOptions"]


@dataclass(frozen=True)
class PoolOptions:
    """How the pool treats its jobs (``hydra.launcher`` keys of the same names)."""

    # re-run a job whose process crashed (not one that raised) up to this many times
    max_retries: int
    # queue a preempted job again (it was stopped from outside, not by the pool) this often
    max_preemptions: int
    # modules the fork server imports once so that jobs start warm; None: those the
    # launcher's process has loaded (a forked server has them already), and what the jobs
    # are seen to import themselves (learned); (): those only, nothing learned
    preload: tuple[str, ...] | None
    # copy each job's stdout/stderr onto the launcher's console as well as its log files
    echo_output: bool
    # time a stopped job gets between SIGTERM and SIGKILL
    stop_grace_s: float
    # fork a job per busy slot ahead, handed the slot the moment its job ends; off where no
    # job may start after a failure (fail_fast): the server cannot tell a failed job's end
    fork_ahead: bool = True
    # modules every job imports before its task (furcate's own job side), which the fork
    # server imports once besides ``preload``, so that no job pays for them
    job_imports: tuple[str, ...] = ()
    # furcate's Lightning layer, which the fork server imports with a Lightning namespace it
    # learns that the jobs import (None: jobs never load it)
    lightning_layer: str | None = None
    # NVIDIA's MPS daemon for GPUs that run several jobs at once: auto, on or off (``mps``)
    mps: str = "off"
    # the most jobs started together on slots as one fused group (``fuse_max``, or
    # ``fused_groups.LEARNED_SEATS`` where it is learned): a slot's seats; 1: no fusion
    fuse_max: int = 1
    # None: groups are ``fuse_max`` wide; else their width is learned, each doubling kept while
    # a member's share of a step falls by at least this fraction (``auto_min_gain``)
    fuse_min_gain: float | None = None
    # how long a group's leader waits at its fit for the others to reach theirs
    fuse_gather_s: float = 300.0
