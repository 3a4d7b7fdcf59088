"""MLflow as furcate's memory: one run per job under one parent run per sweep invocation.

    RunStore.open(uri) ──► check the store answers (a sqlite file: is sound), create it (one
                           process at a time), get/create the experiment (model training)
    start_sweep()      ──► sweeps whose launcher is gone: KILLED; parent run (RUNNING) + heartbeat
    decide(fps)        ──► one lookup for a batch ──► skip / resume / run / elsewhere per config
    claim(requests)    ──► a RUNNING run per config to run, one lookup of rivals (claims.py)
    confirm(claim)     ──► params + "won": the job's run (new, or the resumed one) ──► the job
                           logs into it; a lost claim's run is deleted, the config waited for
                           (the claim protocol is claims.py's ConfigClaims: ``RunStore.claims``)
    follow(runs)       ──► one lookup: what became of configs other launchers hold
    finish_job_run()   ──► FINISHED / FAILED / KILLED + return value + artifacts
    finish_sweep()     ──► parent run's final status

The launcher owns every status change; jobs only log metrics and artifacts into their run.
"""

from __future__ import annotations

import logging
import pickle
import sqlite3
import tempfile
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation
from furcate_hydra.store.claims import Claim, ClaimRequest, ConfigClaims
from furcate_hydra.store.decisions import Action, CodeCheck, Decision, Rerun, decide
from furcate_hydra.store.liveness import Gone, LauncherIdentity, launcher_gone, liveness
from furcate_hydra.store.lookup import find_runs, runs_by_id
from furcate_hydra.store.run_record import (
    RETURN_VALUE_ARTIFACT,
    RunRecord,
    RunStatus,
    Tags,
    decode_return_value,
    encode_return_value,
)
from furcate_hydra.store.store_index import index_sqlite_store
from furcate_hydra.store.tracking_uri import TrackingUri, check_tracking_uri, creating_store

__all__ = ["EXPERIMENT_KIND", "MODEL_TRAINING", "RunStore"]

log = logging.getLogger(__name__)

# How MLflow 3 types an experiment ("Machine learning" or "GenAI apps & agents"): a UI that
# goes by it opens a furcate experiment on its runs, not on a GenAI overview of no traces.
# Newer UIs go by their own GenAI / Model training switch instead, which the link the launcher
# logs sets (see experiment_link).
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


class RunStore:
    """One launcher's connection to the tracking store. Used from one thread (plus its own
    heartbeat thread, which has a client of its own)."""

    def __init__(
        self,
        tracking: TrackingUri,
        experiment_name: str,
        heartbeat_s: float,
        stale_after_s: float,
        *,
        sqlite_wal: bool,
        sqlite_index: bool = False,
        checked: bool = False,
    ) -> None:
        """``checked``: ``check_tracking_uri`` passed already (a sqlite file is checked in
        full, which costs a read of every page). ``sqlite_index``: give a sqlite store
        furcate's index on its tags where it lacks it (``index_sqlite_store``)."""
        from mlflow.tracking import MlflowClient

        # Before the first client: on a database URI it loads MLflow's SQL store, which warns.
        ignore_mlflow_sqlalchemy_deprecation()
        if not checked:
            check_tracking_uri(tracking)
        self.tracking_uri = tracking.uri
        self._sqlite_path = tracking.sqlite_path
        with creating_store(tracking):
            self.client = MlflowClient(tracking.uri)  # a new store's schema is created here
            if sqlite_index and self._sqlite_path is not None:
                index_sqlite_store(self._sqlite_path)
        # the experiment's tags as opened (what the app's earlier sweeps left: app_imports)
        self.experiment_tags: dict[str, str] = {}
        self.experiment_id = self._experiment(experiment_name)
        if sqlite_wal and self._sqlite_path is not None:
            _use_wal(str(self._sqlite_path))
        self.experiment_name = experiment_name
        self.identity = LauncherIdentity.current()
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.sweep_run_id: str | None = None
        # each run's artifact root, from its creation on: an upload needs no lookup of it
        self.artifact_uris: dict[str, str] = {}
        self.claims = ConfigClaims(self)  # a config runs once across launchers
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @staticmethod
    def load_modules(tracking: TrackingUri) -> None:
        """Import what opening the store needs (seconds), without opening it: the modules
        only, no connection and no thread, so that a fork of this process made next can share
        them."""
        import mlflow.tracking

        if tracking.address.scheme in ("sqlite", "postgresql", "mysql", "mssql"):
            ignore_mlflow_sqlalchemy_deprecation()
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    # -- the sweep ----------------------------------------------------------------------

    def start_sweep(self, run_name: str, tags: Mapping[str, str]) -> str:
        """The sweep's parent run, RUNNING, with a heartbeat; sweeps left RUNNING by launchers
        that are gone are ended KILLED first."""
        self.end_orphaned_sweeps()
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={**tags, **self.identity.tags(), Tags.ROLE: "sweep", Tags.HEARTBEAT: _now()},
        )
        self.sweep_run_id = run.info.run_id
        self._heartbeat = threading.Thread(
            target=self._beat, args=(run.info.run_id,), name="furcate-heartbeat", daemon=True
        )
        self._heartbeat.start()
        return self.sweep_run_id

    def end_orphaned_sweeps(self) -> list[str]:
        """Sweep runs still RUNNING whose launcher is gone (killed, its machine restarted):
        ended KILLED, at their last heartbeat, with why. Returns their run ids."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.`{Tags.ROLE}` = 'sweep' and attributes.status = '{RunStatus.RUNNING.value}'"
            ),
            max_results=1000,
        )
        now, ended = time.time(), []
        for run in runs:
            tags = dict(run.data.tags)
            record = RunRecord(run.info.run_id, "", RunStatus.RUNNING, run.info.start_time, tags)
            beat = float(tags[Tags.HEARTBEAT]) if Tags.HEARTBEAT in tags else None
            why = launcher_gone(record, self.identity, beat, now, self.stale_after_s)
            if why is None:
                continue
            self.client.set_tag(run.info.run_id, Tags.ERROR, f"left RUNNING: {why}")
            end_ms = int((beat or now) * 1000)
            self.client.set_terminated(run.info.run_id, RunStatus.KILLED.value, end_time=end_ms)
            ended.append(run.info.run_id)
            log.warning(
                "furcate: sweep run %s (%s) is RUNNING but %s: marked KILLED",
                run.info.run_id,
                run.info.run_name,
                why,
            )
        return ended

    def finish_sweep(self, status: RunStatus, artifacts: Iterable[Path] = ()) -> None:
        self._stop_heartbeat.set()
        if self.sweep_run_id is None:
            return
        for path in artifacts:
            self.log_sweep_artifact(path)
        self.client.set_terminated(self.sweep_run_id, status.value)
        self.sweep_run_id = None

    def log_sweep_artifact(self, path: Path) -> None:
        if self.sweep_run_id is not None and path.exists():
            self.client.log_artifact(self.sweep_run_id, str(path))

    # -- deciding -----------------------------------------------------------------------

    def decide(
        self, fingerprints: Collection[str], rerun: Rerun, code: CodeCheck | None = None
    ) -> dict[str, Decision]:
        """One lookup for the whole batch, then a decision per fingerprint."""
        found = find_runs(self.client, self.experiment_id, fingerprints)
        gone = self.liveness(r for runs in found.values() for r in runs)
        return {fp: decide(found.get(fp, []), rerun, gone, code) for fp in fingerprints}

    def follow(
        self, awaited: Sequence[RunRecord], rerun: Rerun, code: CodeCheck | None = None
    ) -> list[Decision | None]:
        """What became of runs other launchers held (one lookup by run id): None while one still
        runs under a live launcher; SKIP or REPORT_FAILURE (``ran_elsewhere``) once it ended
        FINISHED or FAILED; otherwise (stopped, its launcher gone, a lost claim deleted) the
        config is decided again, from all its runs."""
        current = runs_by_id(self.client, self.experiment_id, [r.run_id for r in awaited])
        gone = self.liveness(current.values())
        followed: list[Decision | None] = []
        again: set[str] = set()
        for record in awaited:
            now = current.get(record.run_id)
            if now is not None and now.status is RunStatus.FINISHED:
                followed.append(Decision(Action.SKIP, now, "ran elsewhere", ran_elsewhere=True))
            elif now is not None and now.status is RunStatus.FAILED:
                failed = Decision(
                    Action.REPORT_FAILURE, now, "failed elsewhere", ran_elsewhere=True
                )
                followed.append(failed)
            elif now is not None and now.status is RunStatus.RUNNING and gone(now) is None:
                followed.append(None)
            else:
                followed.append(None)
                again.add(record.fingerprint)
        if again:
            decided = self.decide(again, rerun, code)
            followed = [
                decided[r.fingerprint] if r.fingerprint in again else d
                for r, d in zip(awaited, followed, strict=True)
            ]
        return followed

    def recorded_return_value(self, record: RunRecord) -> Any:
        text = record.tags.get(Tags.RETURN_VALUE)
        if text is None:
            return None
        if text == "artifact:" + RETURN_VALUE_ARTIFACT:
            with tempfile.TemporaryDirectory() as tmp:
                path = self.client.download_artifacts(record.run_id, RETURN_VALUE_ARTIFACT, tmp)
                return pickle.loads(Path(path).read_bytes())
        return decode_return_value(text)

    # -- job runs -----------------------------------------------------------------------

    def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Claim each config before its job starts; lost claims name the run that holds it."""
        return self.claims.claim(requests)

    def confirm(self, claim: Claim) -> str:
        """The job's run of a won claim, marked won (the new run, or the resumed one)."""
        return self.claims.confirm(claim)

    def withdraw(self, claim: Claim) -> None:
        """Give up a claim not confirmed (the launcher stops before its job started)."""
        self.claims.withdraw(claim)

    def finish_job_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        return_value: Any = None,
        error: str | None = None,
        artifacts: Iterable[Path] = (),
        end_time: float | None = None,
    ) -> None:
        """Record the outcome the launcher saw; the job itself never ends its run."""
        if status is RunStatus.FINISHED:
            encoded = encode_return_value(return_value)
            if encoded is None:
                self._log_pickled_return_value(run_id, return_value)
                encoded = "artifact:" + RETURN_VALUE_ARTIFACT
            # set_tag costs a third of a log_batch on sqlite (~2 ms against ~7 ms).
            self.client.set_tag(run_id, Tags.RETURN_VALUE, encoded)
        if error:
            self.client.set_tag(run_id, Tags.ERROR, error[-7900:])
        self.log_artifacts(run_id, artifacts)
        self.artifact_uris.pop(run_id, None)  # the run is done; keep the map small
        end_ms = int((end_time or time.time()) * 1000)
        self.client.set_terminated(run_id, status=status.value, end_time=end_ms)

    def set_job_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Tag a job's run while it is in flight (what happened to it so far)."""
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_artifacts(self, run_id: str, paths: Iterable[Path]) -> None:
        """Upload files to the run's artifact root (the files that exist)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        uri = self.artifact_uris.get(run_id)
        if uri is None:
            uri = self.artifact_uris[run_id] = self.client.get_run(run_id).info.artifact_uri
        # MlflowClient.log_artifact looks the run up again for every file (~3 ms each).
        repository = get_artifact_repository(uri, tracking_uri=self.tracking_uri)
        for path in paths:
            if path.exists():
                repository.log_artifact(str(path))  # type: ignore[no-untyped-call]

    def latest_metrics(self, run_ids: Collection[str]) -> dict[str, dict[str, float]]:
        """Each run's latest metric values, in one search (for run_data.csv)."""
        if not run_ids:
            return {}
        quoted = ", ".join(f"'{run_id}'" for run_id in run_ids)
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"attributes.run_id IN ({quoted})",
            max_results=max(len(run_ids), 1),
        )
        return {run.info.run_id: dict(run.data.metrics) for run in runs}

    def close(self) -> None:
        self._stop_heartbeat.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)

    def job_run_tags(self, tags: Mapping[str, str]) -> dict[str, str]:
        """A job's run's tags: these, this launcher's identity, the sweep run it is part of."""
        parent = {Tags.PARENT_RUN: self.sweep_run_id} if self.sweep_run_id else {}
        return {**tags, **self.identity.tags(), **parent}

    def liveness(self, records: Iterable[RunRecord]) -> Gone:
        """``launcher_gone`` for these records' RUNNING runs (liveness.py)."""
        return liveness(records, self.identity, self._heartbeats, self.stale_after_s)

    # -- internals ----------------------------------------------------------------------

    def _log_pickled_return_value(self, run_id: str, value: Any) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(RETURN_VALUE_ARTIFACT).name
            path.write_bytes(pickle.dumps(value))
            self.client.log_artifact(run_id, str(path), str(Path(RETURN_VALUE_ARTIFACT).parent))

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                self.client.restore_experiment(experiment.experiment_id)
            experiment_id = str(experiment.experiment_id)
            self.experiment_tags = dict(experiment.tags)
            if EXPERIMENT_KIND not in experiment.tags:
                # made by an older furcate, or by hand: it gets training runs now. A kind
                # someone chose is left as it is.
                self.client.set_experiment_tag(experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
            return experiment_id
        try:
            return str(
                self.client.create_experiment(
                    name,
                    artifact_location=self._artifacts(),
                    tags={EXPERIMENT_KIND: MODEL_TRAINING},
                )
            )
        except MlflowException:
            # Another launcher created it between our two calls.
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            self.experiment_tags = dict(experiment.tags)
            return str(experiment.experiment_id)

    def _artifacts(self) -> str | None:
        # Next to a sqlite file rather than under whatever directory the launcher runs in, so
        # the store and its artifacts stay together (MLflow's ./mlruns when run beside it).
        if self._sqlite_path is None:
            return None
        return str(self._sqlite_path.parent / "mlruns")

    def _heartbeats(self, parent_ids: set[str]) -> dict[str, float]:
        beats: dict[str, float] = {}
        for parent_id in parent_ids:
            try:
                tags = self.client.get_run(parent_id).data.tags
            except Exception:  # a deleted parent: no heartbeat, the child counts as orphaned
                continue
            if Tags.HEARTBEAT in tags:
                beats[parent_id] = float(tags[Tags.HEARTBEAT])
        return beats

    def _beat(self, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        while not self._stop_heartbeat.wait(self.heartbeat_s):
            try:
                client.set_tag(run_id, Tags.HEARTBEAT, _now())
            except Exception as exc:  # a busy store must not stop the sweep
                log.debug("heartbeat not recorded: %s", exc)


def _use_wal(path: str) -> None:
    """Switch a sqlite store to write-ahead logging (it stays so; the file remembers).

    Every job writes its metrics while the launcher records runs: with WAL, readers do not
    block the writer and a commit appends to the log instead of rewriting the journal, which
    measured ~20 % more recorded jobs per second here. WAL needs a local file system.
    """
    try:
        with sqlite3.connect(path, timeout=30) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:  # e.g. a network file system: the default journal still works
        log.warning("could not switch %s to WAL journaling (%s); recording goes on", path, exc)


def _now() -> str:
    return f"{time.time():.3f}"
