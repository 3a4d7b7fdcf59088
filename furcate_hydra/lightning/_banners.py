"""Lightning's start-up lines, which every job of a sweep prints alike, left out while fitting.

A Trainer logs which accelerators exist (``GPU available: …``, ``TPU available: …``) and
advertises Lightning's cloud services (``💡 Tip: …``) each time it is built: in a sweep, the
same lines once per job, with nothing a user can act on (the slot's device is in the launch
log). They go through Lightning's rank-zero logger, at INFO, like messages that do matter
(``Trainer.fit stopped: …``), so a filter on that logger drops these lines by how they start
and lets everything else through; warnings (``GPU available but not used``) are untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BANNER_PREFIXES", "lightning_banners"]

# How each start-up line begins, as Lightning 2.x words it.
BANNER_PREFIXES = ("GPU available:", "TPU available:", "HPU available:", "💡 Tip:")


class _DropBanners(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(BANNER_PREFIXES)


@contextmanager
def lightning_banners(shown: bool) -> Iterator[None]:
    """Within the block, Lightning's start-up lines are logged only if ``shown``."""
    if shown:
        yield
        return
    from lightning_utilities.core import rank_zero

    # Lightning points this module's logger at its own on import
    # (pytorch_lightning.utilities.rank_zero); rank_zero_info writes to whichever it is now.
    logger = rank_zero.log
    dropped = _DropBanners()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)
