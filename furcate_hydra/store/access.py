"""A launcher's way into its store: sqlite3 while it only reads, MLflow once it writes.

    StoreAccess(tracking, experiment)
      decide(fingerprints) ──► the store, if MLflow has opened it
                           ──► else the sqlite file, read with sqlite3 (SqliteReader)
                           ──► else None: open the store first (another kind, a file the
                               reader cannot read), then decide again
      needs_store(decisions) ──► runs to open or follow, a value kept as an artifact: the
                                 caller opens the store (after forking its fork server)
      open() ──► RunStore, once; everything goes through it from then on

MLflow takes seconds to import and open; a rerun whose every config FINISHED never needs it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from furcate_hydra.addresses import shown_url
from furcate_hydra.store.decisions import Action, CodeCheck, Decision, Rerun
from furcate_hydra.store.liveness import LauncherIdentity
from furcate_hydra.store.run_record import (
    RETURN_VALUE_ARTIFACT,
    RunRecord,
    Tags,
    decode_return_value,
)
from furcate_hydra.store.run_store import RunStore
from furcate_hydra.store.sqlite_reader import SqliteReader
from furcate_hydra.store.store_index import index_sqlite_store
from furcate_hydra.store.tracking_uri import TrackingUri
from furcate_hydra.store.ui_link import experiment_link

__all__ = ["StoreAccess"]

log = logging.getLogger(__name__)


class StoreAccess:
    """One experiment of a checked store (``check_tracking_uri`` passed), for one launcher."""

    def __init__(
        self,
        tracking: TrackingUri,
        experiment: str,
        *,
        heartbeat_s: float,
        stale_after_s: float,
        sqlite_wal: bool,
        sqlite_index: bool = False,
    ) -> None:
        self.tracking = tracking
        self.experiment = experiment
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.sqlite_wal = sqlite_wal
        self.sqlite_index = sqlite_index
        self.store: RunStore | None = None
        self._path = _sqlite_path(tracking)
        self._reader: SqliteReader | None = None
        self._identity = LauncherIdentity.current()

    @property
    def can_decide(self) -> bool:
        """Whether ``decide`` may answer before the store is opened (a readable sqlite file)."""
        return self.store is not None or self._path is not None

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id, where the store or the file has it."""
        if self.store is not None:
            return self.store.experiment_id
        return self._reader.experiment_id if self._reader is not None else None

    def needs_store(self, decisions: Sequence[Decision]) -> bool:
        """Whether these decisions write into the store (runs to open, claims to follow) or
        read more than the file (a return value kept as an artifact)."""
        if self.store is not None:
            return False
        for decision in decisions:
            if decision.action not in (Action.SKIP, Action.REPORT_FAILURE):
                return True
            record = decision.record
            text = record.tags.get(Tags.RETURN_VALUE, "") if record is not None else ""
            if text == "artifact:" + RETURN_VALUE_ARTIFACT:
                return True
        return False

    def load_modules(self) -> None:
        """Import MLflow (seconds) without opening the store: see ``RunStore.load_modules``."""
        if self.store is None:
            RunStore.load_modules(self.tracking)

    def open(self) -> RunStore:
        """The store, opened by MLflow once."""
        if self.store is None:
            # loading MLflow and, the first time, creating a store's tables takes seconds
            log.info("furcate: opening the MLflow store %s …", shown_url(self.tracking.uri))
            self.store = RunStore(
                self.tracking,
                self.experiment,
                self.heartbeat_s,
                self.stale_after_s,
                sqlite_wal=self.sqlite_wal,
                # a reader was opened: the file had MLflow's tables, and _sqlite indexed them
                sqlite_index=self.sqlite_index and self._reader is None,
                checked=True,
            )
            self._reader = None
            log.info(
                "furcate: recording runs in experiment %r; to see them: %s",
                self.experiment,
                experiment_link(self.tracking.uri, self.store.experiment_id),
            )
        return self.store

    def decide(
        self, fingerprints: Collection[str], rerun: Rerun, code: CodeCheck
    ) -> dict[str, Decision] | None:
        """A decision per fingerprint, one lookup; None where only MLflow can tell."""
        if self.store is not None:
            return self.store.decide(fingerprints, rerun, code)
        reader = self._sqlite()
        if reader is None:
            return None
        try:
            return reader.decide(fingerprints, rerun, code, self._identity, self.stale_after_s)
        except sqlite3.Error as exc:
            self._unreadable(exc)
            return None

    def recorded_return_value(self, record: RunRecord) -> Any:
        if self.store is not None:
            return self.store.recorded_return_value(record)
        text = record.tags.get(Tags.RETURN_VALUE)  # not an artifact: see needs_store
        return None if text is None else decode_return_value(text)

    def latest_metrics(self, run_ids: Collection[str]) -> dict[str, dict[str, float]]:
        if self.store is not None:
            return self.store.latest_metrics(run_ids)
        reader = self._sqlite()
        try:
            return reader.latest_metrics(run_ids) if reader is not None else {}
        except sqlite3.Error as exc:  # run_data.csv goes without them
            self._unreadable(exc)
            return {}

    def _sqlite(self) -> SqliteReader | None:
        if self._reader is None and self._path is not None:
            try:
                if self.sqlite_index:  # before the first lookup, which it speeds up
                    index_sqlite_store(self._path)
                self._reader = SqliteReader(self._path, self.experiment)
            except (sqlite3.Error, OSError) as exc:  # OSError: its schema lock
                self._unreadable(exc)
        return self._reader

    def _unreadable(self, exc: Exception) -> None:
        log.debug("furcate: %s is read through MLflow: %s", self.tracking.uri, exc)
        self._path = self._reader = None


def _sqlite_path(tracking: TrackingUri) -> Path | None:
    """The file of a sqlite store (absolute, see resolve_tracking_uri); None for another, and
    for a URL with options (``?…``), which sqlite3 here would not apply: MLflow reads it."""
    address = tracking.address
    return None if address.query else address.sqlite_path
