"""A job run's resource trace in MLflow: its samples as metrics, its trace files as artifacts.

Called on the launcher's tracer thread, with a client of its own (as the heartbeat has), so no
store call of the trace waits on, or holds up, the thread that hands jobs their slots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["TraceLog"]

# MLflow refuses a log_batch of more than 1,000 metrics.
_BATCH = 1000


class TraceLog:
    """Logs into job runs of one store; one thread uses it."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self._tracking_uri = tracking_uri
        self._client = MlflowClient(tracking_uri)

    def log_metrics(
        self, run_id: str, rows: Sequence[tuple[int, float, Mapping[str, float]]]
    ) -> None:
        """``(step, time, {name: value})`` rows, in one ``log_batch`` per 1,000 values."""
        from mlflow.entities import Metric

        metrics = [
            Metric(name, value, int(at * 1000), step)
            for step, at, values in rows
            for name, value in values.items()
        ]
        for start in range(0, len(metrics), _BATCH):
            self._client.log_batch(run_id, metrics=metrics[start : start + _BATCH])

    def log_files(self, run_id: str, files: Sequence[tuple[Path, str | None]]) -> None:
        """Upload each file into the run's artifacts, in the folder named beside it."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        # MlflowClient.log_artifact looks the run up again for every file
        uri = self._client.get_run(run_id).info.artifact_uri
        repository = get_artifact_repository(uri, tracking_uri=self._tracking_uri)
        for path, folder in files:
            repository.log_artifact(str(path), folder)  # type: ignore[no-untyped-call]
