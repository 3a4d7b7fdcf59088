"""The environment a launcher gives each job: where it writes and which MLflow run it logs to.

The launcher sets these variables in the job's process; the Lightning layer reads them. Kept
apart from both so that neither side imports the other's heavy dependencies.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_DIR",
    "EXPERIMENT_ID",
    "OUTPUT_DIR",
    "RUN_ID",
    "TRACKING_URI",
]

TRACKING_URI = "MLFLOW_TRACKING_URI"
RUN_ID = "MLFLOW_RUN_ID"
EXPERIMENT_ID = "MLFLOW_EXPERIMENT_ID"
OUTPUT_DIR = "FURCATE_OUTPUT_DIR"
# Stays the same when an interrupted run is launched again, so the job finds its checkpoints.
CHECKPOINT_DIR = "FURCATE_CHECKPOINT_DIR"
