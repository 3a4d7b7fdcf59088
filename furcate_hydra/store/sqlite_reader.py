"""Read a sqlite MLflow store without MLflow: the skip check of a sweep that may run nothing,
and where the store's sweeps ran.

    RunLedger.prepare ──► SqliteReader.decide(fingerprints): one SELECT, as lookup.py's
                            ──► all SKIP: the rerun ends with nothing imported or started
                            ──► anything else: MLflow opens the store (RunStore) to write
    RunLedger.flush   ──► latest_metrics of the skipped runs, for run_data.csv
    furcate status      ──► sweep_dirs: where the store's sweeps ran, to find the newest

Importing MLflow and opening its SQL store takes seconds (see BENCHMARKS.md); Python's sqlite3
reads the same tables in milliseconds. Only reads, on a read-only connection: anything that
writes goes through MLflow. It reads MLflow's tables ``experiments``, ``runs``, ``tags`` and
``latest_metrics`` by their column names, as MLflow has kept them since 1.x; a store it cannot
read so (no such table or column) raises ``sqlite3.Error``, and the caller opens it with MLflow.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sqlite3
from collections.abc import Collection, Iterator
from pathlib import Path

from furcate_hydra.sqlite_lock import sqlite_schema_made
from furcate_hydra.store.decisions import CodeCheck, Decision, Rerun, decide
from furcate_hydra.store.liveness import LauncherIdentity, liveness
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags

__all__ = ["SqliteReader", "sweep_dirs"]

# Well under sqlite's limit on bound parameters per statement.
_CHUNK = 500
# How long a read waits for a writer's lock (launchers and jobs write the same file).
_BUSY_TIMEOUT_S = 30.0


class SqliteReader:
    """One experiment of a sqlite MLflow store, read-only.

    Args:
        path: The store's file; one that does not exist yet holds no run.
        experiment_name: The experiment the launcher records into.
    """

    def __init__(self, path: Path, experiment_name: str) -> None:
        self.path = path
        self.experiment_id: str | None = None
        if path.exists():
            # a store another process is creating (MLflow makes its tables in steps) is read
            # once it is made, not half made
            with sqlite_schema_made(path), _read_only(path) as connection:
                row = connection.execute(
                    "SELECT experiment_id FROM experiments WHERE name = ?", (experiment_name,)
                ).fetchone()
            self.experiment_id = None if row is None else str(row[0])

    def decide(
        self,
        fingerprints: Collection[str],
        rerun: Rerun,
        code: CodeCheck | None,
        here: LauncherIdentity,
        stale_after_s: float,
    ) -> dict[str, Decision]:
        """What ``RunStore.decide`` decides, from the same rows."""
        found = self.find_runs(fingerprints)
        records = [r for runs in found.values() for r in runs]
        gone = liveness(records, here, self._heartbeats, stale_after_s)
        return {fp: decide(found.get(fp, []), rerun, gone, code) for fp in fingerprints}

    def find_runs(self, fingerprints: Collection[str]) -> dict[str, list[RunRecord]]:
        """Active runs per fingerprint, newest first, with furcate's tags and the parent."""
        if self.experiment_id is None or not fingerprints:
            return {}
        ordered = sorted(fingerprints)
        rows: dict[str, tuple[str, str, int, dict[str, str]]] = {}
        with _read_only(self.path) as connection:
            for chunk in _chunks(ordered):
                query = (
                    "SELECT r.run_uuid, r.status, r.start_time, fp.value, t.key, t.value "
                    "FROM runs r "
                    "JOIN tags fp ON fp.run_uuid = r.run_uuid AND fp.key = ? "
                    "JOIN tags t ON t.run_uuid = r.run_uuid "
                    "WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active' "
                    f"AND fp.value IN ({', '.join('?' * len(chunk))}) "
                    "AND (t.key LIKE 'furcate.%' OR t.key = ?)"
                )
                args = [Tags.FINGERPRINT, int(self.experiment_id), *chunk, Tags.PARENT_RUN]
                for run_id, status, start, fp, key, value in connection.execute(query, args):
                    entry = rows.setdefault(run_id, (fp, status, int(start or 0), {}))
                    entry[3][key] = value
        found: dict[str, list[RunRecord]] = collections.defaultdict(list)
        for run_id, (fp, status, start, tags) in rows.items():
            found[fp].append(RunRecord(run_id, fp, RunStatus.parse(status), start, tags))
        for runs in found.values():
            runs.sort(key=lambda r: r.start_time_ms, reverse=True)
        return dict(found)

    def latest_metrics(self, run_ids: Collection[str]) -> dict[str, dict[str, float]]:
        """Each run's latest metric values (what MLflow shows as a run's metrics)."""
        metrics: dict[str, dict[str, float]] = {}
        if not run_ids or not self.path.exists():
            return metrics
        with _read_only(self.path) as connection:
            for chunk in _chunks(sorted(run_ids)):
                query = (
                    "SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                    f"WHERE run_uuid IN ({', '.join('?' * len(chunk))})"
                )
                for run_id, key, value, is_nan in connection.execute(query, chunk):
                    metrics.setdefault(run_id, {})[key] = math.nan if is_nan else float(value)
        return metrics

    def _heartbeats(self, parent_ids: set[str]) -> dict[str, float]:
        beats: dict[str, float] = {}
        with _read_only(self.path) as connection:
            for chunk in _chunks(sorted(parent_ids)):
                query = (
                    "SELECT run_uuid, value FROM tags WHERE key = ? "
                    f"AND run_uuid IN ({', '.join('?' * len(chunk))})"
                )
                for run_id, value in connection.execute(query, [Tags.HEARTBEAT, *chunk]):
                    beats[run_id] = float(value)
        return beats


def sweep_dirs(path: Path) -> list[str]:
    """The sweep dir of each sweep run in the store at ``path`` (an existing file), newest
    first, as the launcher recorded it (``Tags.SWEEP_DIR``: absolute)."""
    query = (
        "SELECT d.value FROM runs r "
        "JOIN experiments e ON e.experiment_id = r.experiment_id "
        "JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = ? AND role.value = 'sweep' "
        "JOIN tags d ON d.run_uuid = r.run_uuid AND d.key = ? "
        "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active' "
        "ORDER BY r.start_time DESC"
    )
    with sqlite_schema_made(path), _read_only(path) as connection:
        return [str(row[0]) for row in connection.execute(query, (Tags.ROLE, Tags.SWEEP_DIR))]


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    uri = f"{path.absolute().as_uri()}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S)
    try:
        yield connection
    finally:
        connection.close()


def _chunks(values: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]
