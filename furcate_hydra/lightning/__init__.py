"""The job side of furcate: train a LightningModule inside a launched job.

Imported only inside jobs (it imports torch and Lightning); it never imports Hydra. ``fit`` is
the entry point; the callbacks, the logger and ``JobEnv`` are usable on their own.
"""

from __future__ import annotations

from furcate_hydra.lightning.checkpoint import (
    POINTER_NAME,
    AtomicCheckpoint,
    CheckpointCorruptWarning,
    CheckpointPointer,
    final_checkpoint,
    find_resume_checkpoint,
    read_pointer,
)
from furcate_hydra.lightning.fit import (
    CHECKPOINT_ARTIFACT_DIR,
    FINAL_CHECKPOINT_NAME,
    FitResult,
    fit,
)
from furcate_hydra.lightning.history import HISTORY_NAME, MetricsHistory, Row, scalar_metrics
from furcate_hydra.lightning.job_env import (
    CHECKPOINT_DIR_VAR,
    EXPERIMENT_ID_VAR,
    OUTPUT_DIR_VAR,
    RUN_ID_VAR,
    TRACKING_URI_VAR,
    JobEnv,
)
from furcate_hydra.lightning.logger import RunBoundMLFlowLogger
from furcate_hydra.lightning.plots import (
    PLOTS_DIR,
    metric_families,
    plot_history,
    split_metric_name,
)
from furcate_hydra.lightning.pruning import OptunaPruning

__all__ = [
    "CHECKPOINT_ARTIFACT_DIR",
    "CHECKPOINT_DIR_VAR",
    "EXPERIMENT_ID_VAR",
    "FINAL_CHECKPOINT_NAME",
    "HISTORY_NAME",
    "OUTPUT_DIR_VAR",
    "PLOTS_DIR",
    "POINTER_NAME",
    "RUN_ID_VAR",
    "TRACKING_URI_VAR",
    "AtomicCheckpoint",
    "CheckpointCorruptWarning",
    "CheckpointPointer",
    "FitResult",
    "JobEnv",
    "MetricsHistory",
    "OptunaPruning",
    "Row",
    "RunBoundMLFlowLogger",
    "final_checkpoint",
    "find_resume_checkpoint",
    "fit",
    "metric_families",
    "plot_history",
    "read_pointer",
    "scalar_metrics",
    "split_metric_name",
]
