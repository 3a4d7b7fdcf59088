"""Warnings of the libraries we use that say nothing a furcate user can act on.

Each is ignored by a filter as narrow as the warning: its message, its category, and the module
that raises it, so the same deprecation anywhere else (in a user's own code, say) still shows.
A filter is installed right before the code that would raise the warning, not at import time.
"""

from __future__ import annotations

import warnings

__all__ = [
    "ignore_lightning_mid_epoch_resume",
    "ignore_lightning_pytree_deprecation",
    "ignore_mlflow_sqlalchemy_deprecation",
]


def ignore_mlflow_sqlalchemy_deprecation() -> None:
    """Ignore SQLAlchemy 2.1's ``noload`` deprecation, raised once by MLflow's SQL store.

    MLflow's ``sqlalchemy_store`` configures its ORM mappers when it is imported (by any
    ``MlflowClient`` on a database URI), and one of its relationships uses ``lazy="noload"``.
    Nothing of ours uses that loader, and MLflow has to drop it; until then the warning makes
    every run under ``-W error::DeprecationWarning`` (or a suite that runs with it) fail.
    Call this before building an ``MlflowClient``; calling it again changes nothing.
    """
    try:
        from sqlalchemy.exc import SADeprecationWarning
    except ImportError:  # no SQLAlchemy: no SQL store, and no such warning
        return
    warnings.filterwarnings(
        "ignore",
        message=r"The ``noload`` loader strategy is deprecated",
        category=SADeprecationWarning,
        module=r"mlflow\.store\.tracking\.sqlalchemy_store$",
    )


def ignore_lightning_pytree_deprecation() -> None:
    """Ignore torch's ``LeafSpec`` deprecation, raised once per job by Lightning's own pytree code.

    torch deprecated constructing ``torch.utils._pytree.LeafSpec`` (a ``FutureWarning``), and
    Lightning's ``pytorch_lightning.utilities._pytree`` still builds one when it wraps the
    dataloaders, so every job prints it once. Only Lightning can change that line, and the
    warning is attributed to it (the module matched here), so a ``LeafSpec`` built by anyone
    else still warns. Call this in the job before training; calling it again changes nothing.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"(pytorch_lightning|lightning\.pytorch)\.utilities\._pytree$",
    )


def ignore_lightning_mid_epoch_resume() -> None:
    """Ignore Lightning's "resuming … before the epoch ended … not resumable" warning.

    Lightning warns so when a mid-epoch checkpoint is resumed with a DataLoader that has no
    ``state_dict``. ``fit`` follows the training DataLoader and its checkpoints hold what
    replays the epoch's draws (``furcate_hydra.lightning._loader_replay``), so the resume is
    exact and the warning wrong. ``fit`` calls this only once it follows the loader.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"You're resuming from a checkpoint that ended before the epoch ended",
        module=r"(pytorch_lightning|lightning\.pytorch)\.loops\.training_epoch_loop$",
    )


def ignore_lightning_srun_hint() -> None:
    """Ignore Lightning's "the `srun` command is available on your system but is not used".

    Lightning says so in every Trainer on a machine with Slurm installed, unless ``srun``
    started the process: it takes each process for one task of a parallel job. A furcate job
    is one process on its slot, which the launcher started inside its allocation (``srun``
    would start one copy per task instead), so the hint is wrong for it.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"The `srun` command is available on your system but is not used",
        module=r"(lightning_fabric|lightning\.fabric)\.plugins\.environments\.slurm$",
    )
