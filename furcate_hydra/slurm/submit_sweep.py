"""``hydra.launcher.backend=slurm`` on the login node: check, submit, return or follow.

    FurcateLauncher.setup ──► submit_sweep: a store and a study the nodes reach? (else refused,
        nothing submitted) ──► furcate_hydra.slurm.submit: the same command in N allocations
        ──► wait=false: ends the app at once; wait=true: follows the array, then ends it
The sweeper never runs here: each allocation runs the whole command (its sweeper included),
and they share the configs (the store's claims) and an Optuna study (its database).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from furcate_hydra.addresses import StoreAddress
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.hydra_api.options import as_option_error
from furcate_hydra.launching.launcher_options import LauncherOptions
from furcate_hydra.slurm.shared_disk import cluster_nodes, disk_of, shared_with_nodes
from furcate_hydra.slurm.submit import ArrayState, Submission, command_of, follow, submit
from furcate_hydra.store import resolve_tracking_uri

log = logging.getLogger(__name__)

__all__ = ["check_stores", "submit_sweep"]

_SERVER_FIX = (
    "run `mlflow server --backend-store-uri postgresql://... --host 0.0.0.0 --port 5000` on a "
    "machine every node reaches and set {key}=http://THAT_HOST:5000, or put the sqlite file "
    "on a file system the nodes share (NFS, Lustre, GPFS, ...)"
)
_STUDY_FIX = (
    "set hydra.sweeper.storage to a database server every node reaches, e.g. "
    "hydra.sweeper.storage=postgresql+psycopg2://USER:PASSWORD@DBHOST/optuna"
)


def submit_sweep(options: LauncherOptions, config: DictConfig) -> NoReturn:
    """Submit the sweep's allocations and end the app: at once, or once they ended (``wait``).

    Raises:
        OptionError: a store or study the nodes cannot reach, or sbatch refused the job.
        SystemExit: always, once submitted: 0, or 1 if an allocation failed (``wait``).
    """
    try:
        env = check_stores(options, config)
        command = command_of(
            sys.argv, sys.executable, drop=("hydra.launcher.backend", "hydra.sweep.dir")
        )
        submission = Submission(
            command=(*command, "hydra.launcher.backend=local"),
            cwd=Path.cwd(),
            sweep_dir=Path(str(config.hydra.sweep.dir)).resolve(),
            job_name=str(config.hydra.job.name),
            env=env,
            options=options.slurm,
        )
        job = submit(submission)
    except FurcateConfigError as exc:
        raise as_option_error(exc) from None
    slurm = options.slurm
    log.info(
        "furcate: submitted Slurm job %s: %d allocation%s%s, each a pool of slots pulling "
        "the sweep's configs from the store; their logs: %s/slurm-%s_*.out",
        job,
        slurm.allocations,
        "" if slurm.allocations == 1 else "s",
        f" of {slurm.gpus_per_allocation} GPUs" if slurm.gpus_per_allocation else "",
        submission.sweep_dir,
        job,
    )
    log.info("furcate: follow it from anywhere: furcate status %s", submission.sweep_dir)
    if not slurm.wait:
        raise SystemExit(0)

    def told(state: ArrayState) -> None:
        log.info("furcate: Slurm job %s: %s", job, state.line())

    state = follow(job, slurm.poll_s, told)
    if state.failed:
        log.error(
            "furcate: Slurm job %s: %s did not complete; see %s/slurm-%s_*.out",
            job,
            ", ".join(state.failed),
            submission.sweep_dir,
            job,
        )
        raise SystemExit(1)
    raise SystemExit(0)


def check_stores(options: LauncherOptions, config: DictConfig) -> dict[str, str]:
    """Refuse what the allocations cannot share; the environment they need for the store.

    Raises:
        FurcateConfigError: no store, a sqlite store on a disk the nodes do not share, or an
            Optuna study in a sqlite file (or none named).
    """
    if not options.store.enabled:
        raise FurcateConfigError(
            "hydra.launcher.mlflow.enabled",
            False,
            "with hydra.launcher.backend=slurm the allocations share the sweep's configs "
            "through the store's claims; without a store each would run every config",
            "set hydra.launcher.mlflow.enabled=true, with a store every node reaches",
        )
    tracking = resolve_tracking_uri(options.store.tracking_uri)
    database = StoreAddress.parse(tracking.uri).sqlite_path
    if database is not None:
        nodes = cluster_nodes(options.slurm.partition)
        if not shared_with_nodes(database, nodes):
            disk = disk_of(database)
            raise FurcateConfigError(
                tracking.source,
                tracking.uri,
                f"is a sqlite file on this machine's own disk ({disk.fs_type} at {disk.mount}), "
                f"which the Slurm nodes ({', '.join(nodes) or 'unknown'}) do not share",
                _SERVER_FIX.format(key=tracking.source),
            )
    _check_study(config)
    return {"MLFLOW_TRACKING_URI": tracking.uri}


def _check_study(config: DictConfig) -> None:
    sweeper: Any = OmegaConf.select(config, "hydra.sweeper")
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if sweeper is None or "furcate_optuna" not in target:
        return
    storage = OmegaConf.select(config, "hydra.sweeper.storage", default=None)
    if storage is None:
        raise FurcateConfigError(
            "hydra.sweeper.storage",
            None,
            "each allocation's sweeper would make a study of its own (a sqlite file in its "
            "sweep dir): the allocations would not share one study",
            _STUDY_FIX,
        )
    text = str(storage)
    if StoreAddress.parse(text).is_sqlite or text.startswith(("journal:", "file:")):
        raise FurcateConfigError(
            "hydra.sweeper.storage",
            text,
            "is a file that the sweepers of every allocation and all their trials' jobs would "
            "write at once, from several nodes: file locks over a network file system are "
            "not reliable enough for that",
            _STUDY_FIX,
        )
