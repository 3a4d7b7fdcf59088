"""``hydra/sweeper=furcate_optuna``: asynchronous Optuna tuning on the launcher's slots."""
