"""MLflow as the memory of every sweep: runs, fingerprints, skip and resume decisions.

Imports no Hydra; MLflow itself is imported only when a store is opened.
"""

from __future__ import annotations

from furcate_hydra.store.claims import Claim, ClaimRequest
from furcate_hydra.store.code_version import CodeChange, CodeVersion, code_version
from furcate_hydra.store.decisions import Action, CodeCheck, Decision, Rerun, decide
from furcate_hydra.store.liveness import LauncherIdentity, launcher_gone
from furcate_hydra.store.opened_in_process import (
    build_store_for_forks,
    load_run_for_forks,
    set_aside_inherited_connections,
)
from furcate_hydra.store.params import flatten_params
from furcate_hydra.store.run_record import RunRecord, RunStatus, Tags
from furcate_hydra.store.run_store import RunStore
from furcate_hydra.store.tracking_uri import TrackingUri, check_tracking_uri, resolve_tracking_uri

__all__ = [
    "Action",
    "Claim",
    "ClaimRequest",
    "CodeChange",
    "CodeCheck",
    "CodeVersion",
    "Decision",
    "LauncherIdentity",
    "Rerun",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "Tags",
    "TrackingUri",
    "build_store_for_forks",
    "check_tracking_uri",
    "code_version",
    "decide",
    "flatten_params",
    "launcher_gone",
    "load_run_for_forks",
    "resolve_tracking_uri",
    "set_aside_inherited_connections",
]
