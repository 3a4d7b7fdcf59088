"""Every logged value of every metric of many runs: learning curves and resource peaks.

A database-backed store answers one SELECT for all runs (a sweep of 100 jobs with 8 metrics
would otherwise cost 800 requests); an MLflow server is asked per run and metric.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MetricPoint", "metric_histories"]

# Well under sqlite's limit on bound parameters per statement.
_CHUNK = 500


@dataclass(frozen=True)
class MetricPoint:
    step: int
    value: float
    timestamp_ms: int


History = dict[str, list[MetricPoint]]


def metric_histories(client: Any, metric_keys: Mapping[str, Collection[str]]) -> dict[str, History]:
    """``{run_id: {metric: [points by step, then time]}}`` for the given runs' metrics.

    Args:
        client: An ``MlflowClient``.
        metric_keys: Per run id, the metric names to read (a run's ``data.metrics`` keys).
    """
    store = client._tracking_client.store
    if hasattr(store, "ManagedSessionMaker"):
        found = _from_database(store, list(metric_keys))
    else:
        found = {
            run_id: {
                key: [
                    MetricPoint(int(m.step), float(m.value), int(m.timestamp))
                    for m in client.get_metric_history(run_id, key)
                ]
                for key in keys
            }
            for run_id, keys in metric_keys.items()
        }
    for history in found.values():
        for points in history.values():
            points.sort(key=lambda p: (p.step, p.timestamp_ms))
    return {
        run_id: {k: v for k, v in found.get(run_id, {}).items() if k in keys}
        for run_id, keys in metric_keys.items()
    }


def _from_database(store: Any, run_ids: list[str]) -> dict[str, History]:
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    found: dict[str, History] = {}
    with store.ManagedSessionMaker() as session:
        for first in range(0, len(run_ids), _CHUNK):
            query: Any = sa.select(
                SqlMetric.run_uuid,
                SqlMetric.key,
                SqlMetric.step,
                SqlMetric.value,
                SqlMetric.is_nan,
                SqlMetric.timestamp,
            ).where(SqlMetric.run_uuid.in_(run_ids[first : first + _CHUNK]))
            for run_id, key, step, value, is_nan, timestamp in session.execute(query):
                point = MetricPoint(
                    int(step or 0), float("nan") if is_nan else float(value), int(timestamp or 0)
                )
                found.setdefault(run_id, {}).setdefault(key, []).append(point)
    return found
