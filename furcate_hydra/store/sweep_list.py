"""The sweeps a store holds, newest first, each with its state and its job runs per state;
and where they ran, for a command given no sweep dir.

A database-backed store counts every listed sweep's runs in one grouped SELECT; an MLflow
server is asked per sweep. Where a sqlite store's sweeps ran is read with sqlite3, without
MLflow.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.liveness import LauncherIdentity, launcher_gone
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags
from furcate_hydra.store.sqlite_reader import sweep_dirs
from furcate_hydra.store.sweep_reader import open_client
from furcate_hydra.store.tracking_uri import TrackingUri

__all__ = ["SweepSummary", "list_sweeps", "recorded_sweep_dirs"]

# the launcher's default mlflow.stale_after_s: the store does not record each sweep's
_STALE_AFTER_S = 60.0
_PAGE = 1000


@dataclass(frozen=True)
class SweepSummary:
    """One sweep run: where its dir is, how it stands, and its job runs per state.

    ``status`` is the sweep run's, or ``INTERRUPTED`` when it is RUNNING and its launcher is
    gone; its RUNNING job runs then count as INTERRUPTED too.
    """

    run_id: str
    experiment: str
    sweep_dir: str
    status: str
    reason: str | None
    start: float
    end: float | None
    command: str
    counts: dict[str, int]


def list_sweeps(
    client: Any, experiments: Sequence[str] = (), limit: int = 20, now: float | None = None
) -> list[SweepSummary]:
    """The newest ``limit`` sweeps of the named experiments (all of them when none named)."""
    from mlflow.exceptions import MlflowException

    names = {e.experiment_id: e.name for e in client.search_experiments()}
    if experiments:
        names = {i: name for i, name in names.items() if name in experiments}
    if not names:
        return []
    runs = client.search_runs(
        list(names),
        filter_string=f"tags.`{Tags.ROLE}` = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
    )
    try:
        counts = _counts(client, {run.info.run_id: run.info.experiment_id for run in runs})
    except MlflowException:
        counts = {}
    here, now = LauncherIdentity.current(), time.time() if now is None else now
    summaries = []
    for run in runs:
        tags = dict(run.data.tags)
        status, reason = str(run.info.status), None
        per_state = dict(counts.get(run.info.run_id, {}))
        if status == RunStatus.RUNNING.value:
            record = RunRecord(run.info.run_id, "", RunStatus.RUNNING, run.info.start_time, tags)
            beat = float(tags[Tags.HEARTBEAT]) if Tags.HEARTBEAT in tags else None
            reason = launcher_gone(record, here, beat, now, _STALE_AFTER_S)
            if reason is not None:
                status = "INTERRUPTED"
                if "RUNNING" in per_state:
                    per_state["INTERRUPTED"] = per_state.pop("RUNNING")
        summaries.append(
            SweepSummary(
                run_id=run.info.run_id,
                experiment=names[run.info.experiment_id],
                sweep_dir=tags.get(Tags.SWEEP_DIR, ""),
                status=status,
                reason=reason,
                start=run.info.start_time / 1000,
                end=run.info.end_time / 1000 if run.info.end_time else None,
                command=tags.get(Tags.OVERRIDES, ""),
                counts=per_state,
            )
        )
    return summaries


def recorded_sweep_dirs(tracking: TrackingUri) -> Iterator[str]:
    """Each sweep run's sweep dir (absolute, as the launcher tagged it), newest first; none
    from a sqlite file that is not there.

    A sqlite file is read with sqlite3, so that choosing a sweep costs no MLflow import;
    other stores are searched page by page through MLflow, as long as the caller reads on.

    Raises:
        FurcateConfigError: Naming the store's setting, when it cannot be read.
    """
    path = tracking.sqlite_path
    if path is not None:
        if not path.is_file():
            return
        try:
            found = sweep_dirs(path)
        except (sqlite3.Error, OSError) as exc:
            raise FurcateConfigError(
                tracking.source,
                tracking.uri,
                f"it cannot be read as an MLflow store ({exc})",
                "give the sweep dir, or --tracking-uri of the store the sweep recorded into",
            ) from None
        yield from found
        return
    client = open_client(tracking)
    experiments = [e.experiment_id for e in client.search_experiments()]
    token = None
    while experiments:
        page = client.search_runs(
            experiments,
            filter_string=f"tags.`{Tags.ROLE}` = 'sweep'",
            order_by=["attributes.start_time DESC"],
            max_results=_PAGE,
            page_token=token,
        )
        yield from (str(run.data.tags.get(Tags.SWEEP_DIR, "")) for run in page)
        token = page.token
        if not token:
            return


def _counts(client: Any, sweep_ids: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Per sweep run (given with its experiment), its child runs per MLflow status."""
    if not sweep_ids:
        return {}
    store = client._tracking_client.store
    if hasattr(store, "ManagedSessionMaker"):
        return _counts_from_database(store, sweep_ids)
    counts: dict[str, dict[str, int]] = {}
    for sweep_id, experiment_id in sweep_ids.items():
        per_state: collections.Counter[str] = collections.Counter()
        token = None
        while True:
            page = client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{Tags.PARENT_RUN}` = '{sweep_id}'",
                max_results=1000,
                page_token=token,
            )
            per_state.update(str(run.info.status) for run in page)
            token = page.token
            if not token:
                break
        counts[sweep_id] = dict(per_state)
    return counts


def _counts_from_database(store: Any, sweep_ids: Collection[str]) -> dict[str, dict[str, int]]:
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag

    query: Any = (
        sa.select(SqlTag.value, SqlRun.status, sa.func.count())
        .join(SqlRun, SqlRun.run_uuid == SqlTag.run_uuid)
        .where(
            SqlTag.key == Tags.PARENT_RUN,
            SqlTag.value.in_(list(sweep_ids)),
            SqlRun.lifecycle_stage == "active",
        )
        .group_by(SqlTag.value, SqlRun.status)
    )
    counts: dict[str, dict[str, int]] = {}
    with store.ManagedSessionMaker() as session:
        for parent, status, number in session.execute(query):
            counts.setdefault(parent, {})[str(status)] = int(number)
    return counts
