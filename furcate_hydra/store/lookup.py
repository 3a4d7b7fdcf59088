"""Find the recorded runs of many configs at once: one query per batch, never one per job.

MLflow's search filter cannot match a tag against a list of values, and loading whole runs
costs ~1 ms each (params, metrics, tags). For database-backed stores the lookup therefore
asks the store's own database one SELECT for just the runs' status and furcate tags. An
MLflow server offers no such query; there the lookup pages through the experiment's
fingerprinted runs with ``search_runs`` and filters them here (the RUNNING ones only, for a
check of claims; by run id, for runs followed while another launcher holds them).
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterator
from typing import Any

from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags
from furcate_hydra.store.store_index import tags_indexed

__all__ = ["find_runs", "runs_by_id"]

# Well under sqlite's limit on bound parameters per statement.
_CHUNK = 500
# Run ids per search_runs filter on a server (each id is 32 characters of the filter string).
_ID_CHUNK = 100


def find_runs(
    client: Any, experiment_id: str, fingerprints: Collection[str], *, running_only: bool = False
) -> dict[str, list[RunRecord]]:
    """Active runs per fingerprint in the experiment, newest first; missing ones are absent.
    ``running_only``: only RUNNING runs (the claims on a config, see store/claims.py)."""
    wanted = set(fingerprints)
    if not wanted:
        return {}
    store = client._tracking_client.store
    if hasattr(store, "ManagedSessionMaker"):
        records = _from_database(store, experiment_id, wanted, None, running_only)
    else:
        records = _from_search(client, experiment_id, wanted, running_only)
    found: dict[str, list[RunRecord]] = collections.defaultdict(list)
    for record in records:
        found[record.fingerprint].append(record)
    for runs in found.values():
        runs.sort(key=lambda r: r.start_time_ms, reverse=True)
    return dict(found)


def runs_by_id(client: Any, experiment_id: str, run_ids: Collection[str]) -> dict[str, RunRecord]:
    """The active fingerprinted runs among ``run_ids``, by id: a few runs followed, without
    reading every run of their configs."""
    wanted = set(run_ids)
    if not wanted:
        return {}
    store = client._tracking_client.store
    if hasattr(store, "ManagedSessionMaker"):
        records = _from_database(store, experiment_id, None, wanted, False)
    else:
        records = _by_id_search(client, experiment_id, sorted(wanted))
    return {record.run_id: record for record in records}


def _from_database(
    store: Any,
    experiment_id: str,
    fingerprints: set[str] | None,
    run_ids: set[str] | None = None,
    running_only: bool = False,
) -> Iterator[RunRecord]:
    """One SELECT per chunk of fingerprints (or run ids): status, start and furcate's tags."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlParam, SqlRun, SqlTag

    fp_tag = sa.orm.aliased(SqlTag)
    other = sa.orm.aliased(SqlTag)
    ordered = sorted(fingerprints if fingerprints is not None else run_ids or ())
    column: Any = fp_tag.value if fingerprints is not None else SqlRun.run_uuid
    # whether params are logged (a won claim), for a few runs: not for the skip check's lookup
    # of a whole batch, which does not need it (params has an index on run_uuid)
    params: Any = (
        sa.exists().where(SqlParam.run_uuid == SqlRun.run_uuid)
        if running_only or fingerprints is None
        else sa.literal(False)
    )
    rows: dict[str, tuple[str, str, int, bool, dict[str, str]]] = {}
    indexed = running_only and tags_indexed(store.engine)
    with store.ManagedSessionMaker() as session:
        for start in range(0, len(ordered), _CHUNK):
            chunk = ordered[start : start + _CHUNK]
            query: Any = (
                sa.select(
                    SqlRun.run_uuid,
                    SqlRun.status,
                    SqlRun.start_time,
                    params,
                    fp_tag.value,
                    other.key,
                    other.value,
                )
                .join(
                    fp_tag,
                    sa.and_(fp_tag.run_uuid == SqlRun.run_uuid, fp_tag.key == Tags.FINGERPRINT),
                )
                .join(other, other.run_uuid == SqlRun.run_uuid)
                .where(
                    SqlRun.experiment_id == int(experiment_id),
                    SqlRun.lifecycle_stage == "active",
                    column.in_(chunk),
                    sa.or_(other.key.like("furcate.%"), other.key == Tags.PARENT_RUN),
                )
            )
            if running_only and indexed:
                # the fingerprints' runs by furcate's index, those RUNNING among them
                query = query.where(SqlRun.status == RunStatus.RUNNING.value)
            elif running_only:
                # the experiment's RUNNING runs first (a scan of its runs), then their tags by
                # run id: without furcate's index sqlite would otherwise read every
                # fingerprint tag of the store, a slower scan
                running = sa.select(SqlRun.run_uuid).where(
                    SqlRun.experiment_id == int(experiment_id),
                    SqlRun.status == RunStatus.RUNNING.value,
                )
                query = query.where(SqlRun.run_uuid.in_(running))
            for run_id, status, start, logged, fp, key, value in session.execute(query):
                entry = rows.setdefault(run_id, (fp, status, int(start or 0), bool(logged), {}))
                entry[4][key] = value
    for run_id, (fp, status, start, logged, tags) in rows.items():
        yield RunRecord(run_id, fp, RunStatus.parse(status), start, tags, logged)


def _from_search(
    client: Any, experiment_id: str, wanted: set[str], running_only: bool = False
) -> Iterator[RunRecord]:
    condition = f"tags.`{Tags.FINGERPRINT}` LIKE '%'"
    if running_only:
        condition += f" and attributes.status = '{RunStatus.RUNNING.value}'"
    for record in _search(client, experiment_id, condition):
        if record.fingerprint in wanted:
            yield record


def _by_id_search(client: Any, experiment_id: str, run_ids: list[str]) -> Iterator[RunRecord]:
    for start in range(0, len(run_ids), _ID_CHUNK):
        quoted = ", ".join(f"'{run_id}'" for run_id in run_ids[start : start + _ID_CHUNK])
        yield from _search(client, experiment_id, f"attributes.run_id IN ({quoted})")


def _search(client: Any, experiment_id: str, condition: str) -> Iterator[RunRecord]:
    """Every active fingerprinted run ``search_runs`` finds, page by page."""
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=condition, max_results=10000, page_token=token
        )
        for run in page:
            fp = run.data.tags.get(Tags.FINGERPRINT)
            if fp is not None:
                tags = {
                    k: v
                    for k, v in run.data.tags.items()
                    if k.startswith("furcate.") or k == Tags.PARENT_RUN
                }
                yield RunRecord(
                    run.info.run_id,
                    fp,
                    RunStatus.parse(run.info.status),
                    int(run.info.start_time or 0),
                    tags,
                    bool(run.data.params),
                )
        token = page.token
        if not token:
            return
