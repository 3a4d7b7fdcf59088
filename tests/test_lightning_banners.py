"""Lightning's start-up lines are left out while fit runs; its other messages are not."""

from __future__ import annotations

import logging

from furcate_hydra.lightning._banners import lightning_banners

GPU = "GPU available: False, used: False"
TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger"
STOPPED = "`Trainer.fit` stopped: `max_epochs=2` reached."


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def logged(shown: bool) -> list[str]:
    """What reaches Lightning's rank-zero logger (where its Trainer and fit loop write) from
    inside the block, then after it."""
    from lightning_utilities.core import rank_zero
    from pytorch_lightning.utilities import rank_zero_info

    collect = Collect()
    rank_zero.log.addHandler(collect)  # Lightning may not propagate to the root logger
    try:
        with lightning_banners(shown=shown):
            for message in (GPU, TIP, STOPPED):
                rank_zero_info(message)
        rank_zero_info(GPU)  # Lightning as it was
    finally:
        rank_zero.log.removeHandler(collect)
    return collect.messages


def test_the_banners_are_left_out_only_within_the_block() -> None:
    assert logged(shown=False) == [STOPPED, GPU]


def test_banners_true_shows_them() -> None:
    assert logged(shown=True) == [GPU, TIP, STOPPED, GPU]
