"""How many trials are in flight at once: ``hydra.sweeper.n_jobs`` against the launcher's slots.

hydra-optuna-sweeper launches ``n_jobs`` trials and waits for them all; here ``n_jobs`` is the
number of trials in flight, one per slot where it is unset. Configs written for
hydra-optuna-sweeper often say ``n_jobs: 1``, which here would keep all slots but one idle:
that is said once, with the fix, and the sweep runs as asked.
"""

from __future__ import annotations

import logging

__all__ = ["trials_in_flight"]

log = logging.getLogger(__name__)


def trials_in_flight(n_jobs: int | None, slots: int, to_run: int, *, batches: bool) -> int:
    """The trials to keep in flight on ``slots`` slots, ``to_run`` trials left to run.

    Says once (a warning) where ``n_jobs`` leaves slots idle. Streaming, a trial per slot is
    the most that runs: a larger ``n_jobs`` runs one per slot, said once (info); in batches
    (hydra-optuna-sweeper's loop) a batch of ``n_jobs`` waits in the launcher's queue, as there.
    """
    if n_jobs is None:
        return slots
    if n_jobs < slots and to_run > n_jobs:
        idle = slots - n_jobs
        log.warning(
            "furcate_optuna: hydra.sweeper.n_jobs=%d keeps %s in flight while the launcher has "
            "%d slots: %s idle; remove n_jobs (one trial per slot) or set it to %d",
            n_jobs,
            _counted(n_jobs, "trial"),
            slots,
            _counted(idle, "slot"),
            slots,
        )
    if n_jobs > slots and not batches:
        if to_run > slots:
            log.info(
                "furcate_optuna: hydra.sweeper.n_jobs=%d is more than the launcher's %d slots: "
                "%d trials run at once, one per slot",
                n_jobs,
                slots,
                slots,
            )
        return slots
    return n_jobs


def _counted(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
