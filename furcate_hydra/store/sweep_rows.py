"""A sweep's run_data.csv rows, kept in a private temporary sqlite file rather than in memory.

The launcher rewrites run_data.csv as jobs end, in job order with a column per metric any job
logged, so it needs every row so far; held as objects they grow the launcher by ~1.5 KB per
job for as long as it runs. Here each row is one line of a table that sqlite keeps on disk
beyond a small page cache, and the csv is written from a query in job order.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any

from furcate_hydra.store.run_data import JobRow, jsonable

__all__ = ["SweepRows"]

_SCHEMA = """
CREATE TABLE rows (
    key TEXT PRIMARY KEY,  -- the job's key in its launcher: unique among its jobs
    job_num INTEGER NOT NULL,
    run_id TEXT,
    status TEXT NOT NULL,
    skipped INTEGER NOT NULL,
    metrics_pending INTEGER NOT NULL,  -- its run's final metrics not read from the store yet
    row TEXT NOT NULL  -- the JobRow as JSON, its return value as run_data.csv shows it
);
CREATE INDEX rows_by_num ON rows (job_num);
CREATE INDEX rows_by_run ON rows (run_id);
"""


class SweepRows:
    """The rows of one sweep, by job key; one thread, like the run ledger that owns it."""

    def __init__(self) -> None:
        # "": a private temporary database on disk, deleted when the connection closes
        self._db = sqlite3.connect("", isolation_level=None)
        self._db.executescript(_SCHEMA)
        self.metric_names: set[str] = set()

    def __len__(self) -> int:
        (count,) = self._db.execute("SELECT count(*) FROM rows").fetchone()
        return int(count)

    def __bool__(self) -> bool:  # without counting every row
        return bool(self._db.execute("SELECT EXISTS (SELECT 1 FROM rows)").fetchone()[0])

    def add(self, key: str, row: JobRow, metrics_pending: bool = False) -> None:
        """Store ``row`` (replacing one of the same key); ``metrics_pending`` until
        ``set_metrics`` is given its run's metrics."""
        self.metric_names.update(row.metrics)
        self._db.execute(
            "INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                row.job_num,
                row.run_id,
                row.status,
                row.skipped,
                metrics_pending,
                _to_json(row),
            ),
        )

    def get(self, key: str) -> JobRow | None:
        found = self._db.execute("SELECT row FROM rows WHERE key = ?", (key,)).fetchone()
        return None if found is None else _from_json(found[0])

    def pending_runs(self, limit: int) -> list[str]:
        """Up to ``limit`` runs whose rows wait for their metrics."""
        query = "SELECT DISTINCT run_id FROM rows WHERE metrics_pending AND run_id IS NOT NULL"
        return [run_id for (run_id,) in self._db.execute(f"{query} LIMIT ?", (limit,))]

    def set_metrics(
        self, run_ids: Sequence[str], metrics: Mapping[str, Mapping[str, float]]
    ) -> list[JobRow]:
        """Give the rows of ``run_ids`` their runs' metrics (none found: none), pending no
        more; returns the rows that got metrics."""
        updated: list[JobRow] = []
        for run_id in run_ids:
            found = metrics.get(run_id)
            rows = self._db.execute(
                "SELECT key, row FROM rows WHERE run_id = ? AND metrics_pending", (run_id,)
            ).fetchall()
            for key, text in rows:
                row = _from_json(text)
                if found:
                    row.metrics = dict(found)
                    self.metric_names.update(found)
                    updated.append(row)
                self._db.execute(
                    "UPDATE rows SET row = ?, metrics_pending = 0 WHERE key = ?",
                    (_to_json(row), key),
                )
        return updated

    def in_job_order(self) -> Iterator[JobRow]:
        for (text,) in self._db.execute("SELECT row FROM rows ORDER BY job_num, key"):
            yield _from_json(text)

    def all_finished(self) -> bool:
        """Whether every row says FINISHED (so the sweep did too)."""
        query = "SELECT EXISTS (SELECT 1 FROM rows WHERE status != 'FINISHED')"
        return not self._db.execute(query).fetchone()[0]

    def close(self) -> None:
        self._db.close()


_FIELDS = tuple(f.name for f in fields(JobRow))


def _to_json(row: JobRow) -> str:
    data: dict[str, Any] = {name: getattr(row, name) for name in _FIELDS}
    data["return_value"] = jsonable(row.return_value)
    return json.dumps(data)


def _from_json(text: str) -> JobRow:
    return JobRow(**json.loads(text))
