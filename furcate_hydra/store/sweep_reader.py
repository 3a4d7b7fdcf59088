"""Open a sweep's store from its sweep dir, and read what its jobs are doing or did.

    <sweep dir>/furcate_sweep.json ──► store + sweep run   (no file: the run tagged with the dir,
                                                            in --tracking-uri or the default store)
    store: the sweep run's children, the runs skipped jobs were taken from, pruned epochs
    sweep dir: run_data.json of each job this sweep started or skipped, progress.json of
               running ones
    ──► sweep_snapshot.job_snapshots ──► SweepSnapshot

Reads only; works while the sweep runs (a sqlite store in WAL mode takes readers beside its
writers) and from any working directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation
from furcate_hydra.layout import JobPaths, SweepPaths
from furcate_hydra.progress import JobProgress, read_progress
from furcate_hydra.store.liveness import LauncherIdentity, launcher_gone, process_start_ticks
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags
from furcate_hydra.store.stored_runs import has_database, stored_runs
from furcate_hydra.store.sweep_pointer import SweepPointer, SweepPointerError
from furcate_hydra.store.sweep_snapshot import (
    FileRow,
    StoredRun,
    SweepJobStatus,
    SweepSnapshot,
    job_snapshots,
)
from furcate_hydra.store.tracking_uri import TrackingUri, check_tracking_uri, resolve_tracking_uri

__all__ = ["INTERMEDIATE_METRIC", "SWEEP_DIR_ARG", "SweepReader", "open_client"]

SWEEP_DIR_ARG = "SWEEP_DIR"
# what the Optuna sweeper logs per reported epoch on a trial's run (its TrialTags)
INTERMEDIATE_METRIC = "optuna.intermediate_value"
_PRUNED = "PRUNED"
# file times lag time.time() by a clock tick; a file this much older than the sweep's start
# still counts as the sweep's
_CLOCK_SLACK_S = 1.0
# job dirs nest at most this deep under the sweep dir (hydra.sweep.subdir with slashes)
_MAX_DEPTH = 3
_NOT_JOB_DIRS = {".hydra", JobPaths.CHECKPOINTS, JobPaths.PLOTS, SweepPaths.REPORT_DIR}
_PAGE = 1000


class SweepReader:
    """A sweep dir and, where it recorded into one, its store.

    Args:
        sweep_dir: The sweep's dir (Hydra's ``hydra.sweep.dir``).
        tracking_uri: The store to read instead of the one the sweep dir names (a store that
            moved, or the same store through an ``mlflow server``); for a sweep dir without
            ``furcate_sweep.json``, the store to look for its sweep run in (default: as the
            launcher's default, ``MLFLOW_TRACKING_URI`` or ``./mlflow.db``).

    Raises:
        FurcateConfigError: Naming ``SWEEP_DIR`` or the store's setting, when the dir is no
            sweep's or the store cannot be read.
    """

    def __init__(self, sweep_dir: Path, tracking_uri: str | None = None) -> None:
        self.paths = SweepPaths.of(sweep_dir)
        if not self.paths.sweep_dir.is_dir():
            raise FurcateConfigError(
                SWEEP_DIR_ARG,
                str(sweep_dir),
                "no such directory",
                "give the sweep dir of a sweep (Hydra's hydra.sweep.dir, e.g. "
                "multirun/2026-01-31/12-00-00), or run in the directory holding multirun/",
            )
        self.record = self._read_record()
        self.client: Any = None
        self.sweep_run: Any = None
        self.tracking_uri: str | None = None
        if tracking_uri:
            self._open(TrackingUri(tracking_uri, "--tracking-uri"))
        elif self.record is not None and self.record.tracking_uri:
            source = f"tracking_uri in {self.paths.sweep_record}"
            self._open(TrackingUri(self.record.tracking_uri, source))
        elif self.record is None:
            self._open(resolve_tracking_uri(None), lookup_only=True)
        if self.sweep_run is None and self.record is None and not any(self._run_data_files()):
            raise FurcateConfigError(
                SWEEP_DIR_ARG,
                str(sweep_dir),
                f"no furcate sweep recorded there: it has no {SweepPaths.SWEEP_RECORD}, no job "
                f"{JobPaths.RUN_DATA}, and no run in {self.tracking_uri or 'the default store'} "
                "is tagged with it",
                "give the sweep dir of a sweep run with hydra/launcher=furcate, or "
                "--tracking-uri of the store it recorded into",
            )

    # -- opening ------------------------------------------------------------------------

    def _read_record(self) -> SweepPointer | None:
        try:
            return SweepPointer.read(self.paths.sweep_record)
        except FileNotFoundError:
            return None
        except (OSError, SweepPointerError) as exc:
            raise FurcateConfigError(
                SWEEP_DIR_ARG,
                str(self.paths.sweep_dir),
                f"its {SweepPaths.SWEEP_RECORD} cannot be read ({exc})",
                "delete it and pass --tracking-uri of the store the sweep recorded into",
            ) from None

    def _open(self, tracking: TrackingUri, lookup_only: bool = False) -> None:
        """Connect, and find the sweep run (by the record's id, else by its sweep dir tag)."""
        if lookup_only and _missing_sqlite(tracking):
            return  # no default store here: the dir's own files are all there is
        self.client = open_client(tracking)
        self.tracking_uri = tracking.uri
        run_id = self.record.sweep_run_id if self.record else None
        if run_id:
            self.sweep_run = self._get_run(run_id, tracking)
        else:
            self.sweep_run = self._find_sweep_run()

    def _get_run(self, run_id: str, tracking: TrackingUri) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id)
        except MlflowException:
            raise FurcateConfigError(
                tracking.source,
                tracking.uri,
                f"the store has no run {run_id}, the sweep run {self.paths.sweep_record} names",
                "pass --tracking-uri of the store this sweep recorded into",
            ) from None

    def _find_sweep_run(self) -> Any:
        where = str(self.paths.sweep_dir)
        if "'" in where:
            return None  # cannot be quoted in a search filter
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        if not experiments:
            return None
        found = self.client.search_runs(
            experiments,
            filter_string=f"tags.`{Tags.SWEEP_DIR}` = '{where}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return found[0] if found else None

    # -- reading ------------------------------------------------------------------------

    def snapshot(self, now: float | None = None) -> SweepSnapshot:
        """The sweep and its jobs as they are now."""
        now = time.time() if now is None else now
        here = LauncherIdentity.current()
        sweep = self.sweep_run
        start = self.record.started_at if self.record else None
        if sweep is not None:
            start = sweep.info.start_time / 1000 if start is None else start
        heartbeat = _heartbeat(sweep)
        stale_after_s = self.record.stale_after_s if self.record else 60.0

        def gone(record: RunRecord) -> str | None:
            return launcher_gone(record, here, heartbeat, now, stale_after_s)

        def progress(output_dir: str) -> JobProgress | None:
            found = read_progress(JobPaths.of(output_dir).progress)
            since = (start or 0.0) - _CLOCK_SLACK_S
            return found if found is not None and found.at >= since else None  # not an old one

        # the files before the store: a job's run is in the store before its process writes
        # run_data.json, so every row read has its run in the later read, even one that
        # started and ended in between (read the other way round, such a job showed as
        # INTERRUPTED: a row of a process gone, and no run)
        rows = [row for row in map(FileRow.read, self._files_of_this_sweep(start)) if row]
        runs = list(self._job_runs())
        ran = {run.record.run_id for run in runs}
        taken_from = {row.run_id for row in rows if row.run_id and row.run_id not in ran}
        recorded = {run.record.run_id: run for run in self._runs_by_id(taken_from)}
        pruned = self._pruned_epochs([*runs, *recorded.values()])
        jobs = job_snapshots(
            runs,
            rows,
            gone=gone,
            progress=progress,
            alive=_alive,
            pruned_epochs=pruned,
            recorded=recorded,
            now=now,
        )
        status, reason, end = "NOT RECORDED", None, None
        if sweep is None and self._nothing_ran():
            done = all(job.status is SweepJobStatus.SKIPPED for job in jobs)
            status = "FINISHED" if done else "FAILED"
            reason = "nothing ran: every config was recorded before"
        if sweep is not None:
            status = str(sweep.info.status)
            end = sweep.info.end_time / 1000 if sweep.info.end_time else None
            if status == RunStatus.RUNNING.value:
                why = gone(_record_of(sweep))
                if why is not None:
                    status, reason = "INTERRUPTED", why
        return SweepSnapshot(
            sweep_dir=self.paths.sweep_dir,
            status=status,
            reason=reason,
            tracking_uri=self.tracking_uri if sweep is not None or self._nothing_ran() else None,
            experiment=self._experiment_name(),
            sweep_run_id=None if sweep is None else sweep.info.run_id,
            command=str(sweep.data.tags.get(Tags.OVERRIDES, "")) if sweep is not None else "",
            start=start,
            end=end,
            jobs=jobs,
        )

    def _nothing_ran(self) -> bool:
        """A sweep whose every config was recorded before: it wrote nothing into its store
        (no sweep run), and its record names the store and experiment its jobs came from."""
        record = self.record
        return (
            self.sweep_run is None
            and record is not None
            and bool(record.tracking_uri)
            and not record.sweep_run_id
            and bool(record.experiment_id)
        )

    def _job_runs(self) -> Iterator[StoredRun]:
        if self.sweep_run is None:
            return
        parent = self.sweep_run.info.run_id
        if has_database(self.client):  # a few SELECTs, not search_runs' whole runs
            experiment_id = self.sweep_run.info.experiment_id
            yield from stored_runs(self.client, experiment_id, parent_run_id=parent)
            return
        yield from self._search(f"tags.`{Tags.PARENT_RUN}` = '{parent}'")

    def _runs_by_id(self, run_ids: Iterable[str]) -> Iterator[StoredRun]:
        ordered = sorted(run_ids)
        experiment_id = self._experiment_id()
        if ordered and experiment_id is not None and has_database(self.client):
            yield from stored_runs(self.client, experiment_id, run_ids=ordered)
            return
        for first in range(0, len(ordered), 100):
            quoted = ", ".join(f"'{run_id}'" for run_id in ordered[first : first + 100])
            yield from self._search(f"attributes.run_id IN ({quoted})")

    def _search(self, filter_string: str) -> Iterator[StoredRun]:
        experiment_id = self._experiment_id()
        if experiment_id is None:
            return
        token = None
        while True:
            page = self.client.search_runs(
                [experiment_id],
                filter_string=filter_string,
                max_results=_PAGE,
                page_token=token,
            )
            for run in page:
                yield StoredRun(_record_of(run), run.info.end_time, dict(run.data.metrics))
            token = page.token
            if not token:
                return

    def _experiment_id(self) -> str | None:
        """The experiment of the sweep's runs; None where nothing can be read."""
        if self.client is None:
            return None
        if self.sweep_run is not None:
            return str(self.sweep_run.info.experiment_id)
        if self._nothing_ran() and self.record is not None:
            return self.record.experiment_id
        return None

    def _pruned_epochs(self, runs: Iterable[StoredRun]) -> dict[str, int | None]:
        """Per run whose trial the sweeper recorded as PRUNED, the epoch it was pruned at:
        the last one its job reported."""
        epochs: dict[str, int | None] = {}
        for run in runs:
            if run.record.tags.get(Tags.OPTUNA_STATE) != _PRUNED:
                continue
            history = self.client.get_metric_history(run.record.run_id, INTERMEDIATE_METRIC)
            epochs[run.record.run_id] = max((m.step for m in history), default=None)
        return epochs

    def _files_of_this_sweep(self, start: float | None) -> Iterator[Path]:
        """run_data.json files this sweep wrote; in a reused sweep dir, earlier sweeps' are
        left out (by time)."""
        for path in self._run_data_files():
            try:
                if start is None or path.stat().st_mtime >= start - _CLOCK_SLACK_S:
                    yield path
            except OSError:
                continue

    def _run_data_files(self) -> Iterator[Path]:
        top = str(self.paths.sweep_dir)
        for folder, dirs, files in os.walk(top):
            depth = 0 if folder == top else os.path.relpath(folder, top).count(os.sep) + 1
            dirs[:] = [d for d in dirs if d not in _NOT_JOB_DIRS and depth < _MAX_DEPTH]
            if depth > 0 and JobPaths.RUN_DATA in files:
                yield Path(folder) / JobPaths.RUN_DATA

    def _experiment_name(self) -> str | None:
        if self.record is not None and self.record.experiment_name:
            return self.record.experiment_name
        if self.sweep_run is None:
            return None
        return str(self.client.get_experiment(self.sweep_run.info.experiment_id).name)


def open_client(tracking: TrackingUri) -> Any:
    """An MlflowClient for reading ``tracking``; a sqlite file that is not there is an error
    (MLflow would create an empty store instead)."""
    from mlflow.tracking import MlflowClient

    if _missing_sqlite(tracking):
        raise FurcateConfigError(
            tracking.source,
            tracking.uri,
            "no such sqlite file",
            "point it at the store's file (an absolute path: sqlite:////abs/path/mlflow.db)",
        )
    if tracking.sqlite_path is None:
        check_tracking_uri(tracking)
    ignore_mlflow_sqlalchemy_deprecation()  # a SQL store warns when MLflow loads it
    return MlflowClient(tracking.uri)


def _missing_sqlite(tracking: TrackingUri) -> bool:
    path = tracking.sqlite_path
    return path is not None and not path.is_file()


def _record_of(run: Any) -> RunRecord:
    tags = dict(run.data.tags)
    return RunRecord(
        run.info.run_id,
        tags.get(Tags.FINGERPRINT, ""),
        RunStatus.parse(run.info.status),
        int(run.info.start_time or 0),
        tags,
    )


def _heartbeat(sweep_run: Any) -> float | None:
    if sweep_run is None or Tags.HEARTBEAT not in sweep_run.data.tags:
        return None
    try:
        return float(sweep_run.data.tags[Tags.HEARTBEAT])
    except ValueError:
        return None


def _alive(pid: int) -> bool:
    return process_start_ticks(pid) is not None
