"""The job side of furcate: train a LightningModule inside a launched job.

Imported only inside jobs (it imports torch and Lightning); it never imports Hydra. ``fit`` is
the entry point; the callbacks, the logger and ``JobEnv`` are usable on their own, in a Trainer
of the app's making. Everything else lives in private modules.
"""

from __future__ import annotations

from furcate_hydra.lightning._checkpoint import AtomicCheckpoint, CheckpointCorruptWarning
from furcate_hydra.lightning._exact_resume import ResumeNotExactWarning
from furcate_hydra.lightning._fit import FitResult, fit
from furcate_hydra.lightning._history import MetricsHistory
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._logger import RunBoundMLFlowLogger
from furcate_hydra.lightning._pending import install_pending as _install_pending
from furcate_hydra.lightning._pruning import OptunaPruning

__all__ = [
    "AtomicCheckpoint",
    "CheckpointCorruptWarning",
    "FitResult",
    "JobEnv",
    "MetricsHistory",
    "OptunaPruning",
    "ResumeNotExactWarning",
    "RunBoundMLFlowLogger",
    "fit",
]

# a Lightning namespace this package's own imports brought in is patched for the job now that
# the package is whole (hydra.launcher.lightning=auto; see _pending)
_install_pending()
