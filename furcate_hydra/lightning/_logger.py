"""Lightning's MLflow logger, bound to the run the launcher created and owns."""

from __future__ import annotations

import logging
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_fabric.utilities.logger import _convert_params, _flatten_dict
from mlflow.entities import Param
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
from pytorch_lightning.loggers import MLFlowLogger
from pytorch_lightning.utilities import rank_zero_only

from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation
from furcate_hydra.lightning._job_env import JobEnv

__all__ = ["RunBoundMLFlowLogger"]

log = logging.getLogger(__name__)

_BATCH = 100  # MLflow's limit of params per log_batch
_CONFLICT = ErrorCode.Name(INVALID_PARAMETER_VALUE)
_EPOCH = "epoch"  # the key Lightning's logger connector adds to what it logs


class RunBoundMLFlowLogger(MLFlowLogger):
    """Log a job's metrics and hyperparameters into an existing MLflow run, and never end it.

    Differences from ``MLFlowLogger`` (whose constructor only builds a client; given a
    ``run_id``, its ``experiment`` fetches that run instead of creating one, but also sets
    MLflow's process-wide tracking URI):

    * ``experiment`` only fetches the bound run (failing loudly if it does not exist) and takes
      its experiment id; it has no path that creates an experiment or a run, and leaves MLflow's
      global tracking URI alone.
    * ``finalize`` does not call ``set_terminated``: the launcher sets FINISHED/FAILED/KILLED
      after the process exits, from how it exited.
    * ``log_hyperparams`` logs only params the run lacks. The launcher already logged the config
      and MLflow refuses to change a param's value, so an existing key is skipped (a different
      value is logged at DEBUG) instead of failing the fit.
    * Logging is synchronous: a job ends with ``os._exit``, which would drop MLflow's async
      queue, and the launcher reads the run as soon as the process is gone.
    * ``epoch``, which Lightning adds to every batch of metrics it logs, is logged once per
      step: the epoch's validation and training metrics come at the same step, and the second
      point would say nothing new. That series is what MLflow's charts can use as their x axis
      (``X axis: Metric, epoch``) instead of the global step.

    Args:
        tracking_uri: The run's tracking URI. Always passed: ``MLFlowLogger``'s default is read from
            the environment when Lightning is imported, which in a forked job is the server's.
        run_id: The existing run to log into.
        prefix: Put before every metric key, as in ``MLFlowLogger``.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, prefix: str = "") -> None:
        # Before MLFlowLogger builds its client: on a database URI that loads MLflow's SQL
        # store, which warns (in the job, the first thing to touch the store is this logger).
        ignore_mlflow_sqlalchemy_deprecation()
        super().__init__(
            tracking_uri=tracking_uri,
            run_id=run_id,
            prefix=prefix,
            log_model=False,
            synchronous=True,
        )
        self._bound_run_id = run_id
        self._epoch_logged: tuple[int, float] | None = None  # (step, epoch) last logged

    @classmethod
    def from_env(cls, env: JobEnv) -> RunBoundMLFlowLogger:
        """The logger for ``env``'s run; ``env.recording`` must be true."""
        if env.tracking_uri is None or env.run_id is None:
            raise ValueError(
                f"JobEnv is not bound to an MLflow run ({env.tracking_uri=}, {env.run_id=}); "
                "check env.recording before building a RunBoundMLFlowLogger."
            )
        return cls(env.tracking_uri, env.run_id)

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        if not self._initialized:
            run = self._mlflow_client.get_run(self._bound_run_id)
            self._experiment_id = run.info.experiment_id
            self._initialized = True
        return self._mlflow_client

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        epoch = metrics.get(_EPOCH)
        if epoch is not None and step is not None:
            point = (step, float(epoch))
            if point == self._epoch_logged:
                metrics = {k: v for k, v in metrics.items() if k != _EPOCH}
            self._epoch_logged = point
        if metrics:
            super().log_metrics(metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        run_id = self._bound_run_id
        existing = self.experiment.get_run(run_id).data.params
        fresh: list[Param] = []
        for key, raw in _flatten_dict(_convert_params(params)).items():
            value = str(raw)[:MAX_PARAM_VAL_LENGTH]
            if key not in existing:
                fresh.append(Param(key, value))
            elif existing[key] != value:
                log.debug(
                    "Not logging param %s=%r: run %s already has %s=%r.",
                    key, value, run_id, key, existing[key],
                )  # fmt: skip
        for start in range(0, len(fresh), _BATCH):
            chunk = fresh[start : start + _BATCH]
            try:
                self.experiment.log_batch(run_id, params=chunk, synchronous=True)
            except MlflowException as exc:
                if exc.error_code != _CONFLICT:
                    raise
                # someone logged one of these since get_run: go one by one, keep the others
                self._log_params_one_by_one(run_id, chunk)

    def _log_params_one_by_one(self, run_id: str, params: list[Param]) -> None:
        for param in params:
            try:
                self.experiment.log_param(run_id, param.key, param.value, synchronous=True)
            except MlflowException as exc:
                if exc.error_code != _CONFLICT:
                    raise
                log.debug("Not logging param %s=%r: %s", param.key, param.value, exc.message)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        # The base class would log ModelCheckpoint files (off here: log_model=False, and fit logs
        # its own checkpoint) and end the run; the launcher ends it. With synchronous logging
        # nothing is left to flush.
        return None
