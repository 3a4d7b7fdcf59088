"""What runs when: the launcher's scheduling core, free of Hydra (see ``scheduler``)."""

from __future__ import annotations

from furcate_hydra.scheduling.scheduler import (
    ELSEWHERE_POLL_S,
    Handler,
    Ledger,
    Scheduler,
    StreamCounts,
)

__all__ = ["ELSEWHERE_POLL_S", "Handler", "Ledger", "Scheduler", "StreamCounts"]
