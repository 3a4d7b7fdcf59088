"""Optuna's chatter off in a benchmark's process: its info lines, and its warning that the gRPC
storage proxy is experimental. Light to import: spawned job processes call it too."""

from __future__ import annotations

import warnings


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
