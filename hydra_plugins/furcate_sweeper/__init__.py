"""``hydra/sweeper=furcate``: grid sweeps with exclusion filters, streamed onto the slots."""
