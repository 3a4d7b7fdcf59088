"""MLflow as the memory of every sweep: runs, fingerprints, skip and resume decisions.

Imports no Hydra; MLflow itself is imported only when a store is opened.
"""

from __future__ import annotations

from furcate_hydra.store.decisions import Action, Decision, Rerun, decide
from furcate_hydra.store.liveness import LauncherIdentity, launcher_gone
from furcate_hydra.store.params import flatten_params
from furcate_hydra.store.records import RunRecord, RunStatus, Tags
from furcate_hydra.store.run_store import RunStore
from furcate_hydra.store.tracking_uri import TrackingUri, check_tracking_uri, resolve_tracking_uri

__all__ = [
    "Action",
    "Decision",
    "LauncherIdentity",
    "Rerun",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "Tags",
    "TrackingUri",
    "check_tracking_uri",
    "decide",
    "flatten_params",
    "launcher_gone",
    "resolve_tracking_uri",
]
