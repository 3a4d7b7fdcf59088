"""Lightning's MLflow logger, bound to the run the launcher created and owns.

An ``MLFlowLogger`` of either namespace, the app's own or one furcate adds, is bound by being
made as ``RunBound<its class>``: its own class with ``RunBinding`` in front, built with the
job's run and store. The object is the one the app holds, its prefix and ``log_model`` stay,
and what would break a job changes (see ``RunBinding``).
"""

from __future__ import annotations

import logging
from argparse import Namespace as ArgNamespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_utilities.core.rank_zero import rank_zero_only
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
from pytorch_lightning.loggers import MLFlowLogger

from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation
from furcate_hydra.lightning._job_env import JobEnv
from furcate_hydra.lightning._namespace import Namespace

if TYPE_CHECKING:
    from pytorch_lightning.loggers import MLFlowLogger as _LoggerBase
else:
    _LoggerBase = object

__all__ = ["RunBinding", "RunBoundMLFlowLogger", "bound_class", "bound_logger", "job_arguments"]

log = logging.getLogger(__name__)

_BATCH = 100  # MLflow's limit of params per log_batch
_CONFLICT = ErrorCode.Name(INVALID_PARAMETER_VALUE)
_EPOCH = "epoch"  # the key Lightning's logger connector adds to what it logs
# tags of the run that are MLflow's or the launcher's: an app's logger tags never replace them
_OWNED_TAG_PREFIXES = ("mlflow.", "furcate.")


class RunBinding(_LoggerBase):
    """What changes in an ``MLFlowLogger`` bound to a job's run (a mixin in front of its class).

    * ``experiment`` only fetches the bound run (failing loudly if it does not exist) and takes
      its experiment id; it has no path that creates an experiment or a run, and leaves MLflow's
      global tracking URI alone. The app's own logger ``tags`` are set on the run, except keys
      the run already has.
    * ``finalize`` does not end the run: the launcher sets FINISHED/FAILED/KILLED after the
      process exits, from how it exited. Checkpoints the app asked to log (``log_model``) still
      are.
    * ``log_hyperparams`` logs only params the run lacks. The launcher already logged the config
      and MLflow refuses to change a param's value (``['dev']`` against ``["dev"]``, ``None``
      against ``null``), so an existing key is skipped (a different value is logged at DEBUG)
      instead of failing the fit.
    * Logging is synchronous: a job ends with ``os._exit``, which would drop MLflow's async
      queue, and the launcher reads the run as soon as the process is gone.
    * ``epoch``, which Lightning adds to every batch of metrics it logs, is logged once per
      step: the epoch's validation and training metrics come at the same step, and the second
      point would say nothing new. That series is what MLflow's charts can use as their x axis
      (``X axis: Metric, epoch``) instead of the global step.
    """

    _epoch_logged: tuple[int, float] | None = None  # (step, epoch) last logged

    def __reduce_ex__(self, protocol: Any) -> Any:
        # ddp_spawn pickles the Trainer, its loggers with it, into each rank; a class that
        # bound_class made lives in no module, so it is pickled as its base and made again
        cls = type(self)
        base = cls.__bases__[-1]
        if _BOUND_CLASSES.get(base) is not cls:
            return super().__reduce_ex__(protocol)
        return (_new_bound, (base,), self.__dict__)

    @property
    def _bound_run_id(self) -> str:
        return str(self._run_id)  # given to MLFlowLogger.__init__ as run_id

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        if not self._initialized:
            run = self._mlflow_client.get_run(self._bound_run_id)
            self._experiment_id = run.info.experiment_id
            self._initialized = True
            self._tag_run(run.data.tags)
        return self._mlflow_client

    def _tag_run(self, existing: Mapping[str, str]) -> None:
        tags = {
            str(key): str(value)
            for key, value in (self.tags or {}).items()
            if str(key) not in existing and not str(key).startswith(_OWNED_TAG_PREFIXES)
        }
        if tags:  # one call for all of them
            batch = [RunTag(key, value) for key, value in tags.items()]
            self._mlflow_client.log_batch(self._bound_run_id, tags=batch, synchronous=True)

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
    def log_hyperparams(self, params: dict[str, Any] | ArgNamespace) -> None:
        from lightning_fabric.utilities.logger import _convert_params, _flatten_dict

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
        # The launcher ends the run. Checkpoints the app asked for (log_model) still go up.
        callback = getattr(self, "_checkpoint_callback", None)
        if self._initialized and self._log_model and callback is not None:
            self._scan_and_log_checkpoints(callback)


_BOUND_CLASSES: dict[type, type] = {}


def bound_class(cls: type) -> type:
    """``RunBound<cls>``: the ``MLFlowLogger`` class ``cls`` with ``RunBinding`` in front, made
    once per class. Build it with ``job_arguments``' tracking URI and run id."""
    if cls not in _BOUND_CLASSES:
        name = f"RunBound{cls.__name__}"
        _BOUND_CLASSES[cls] = type(name, (RunBinding, cls), {"__module__": cls.__module__})
    return _BOUND_CLASSES[cls]


def _new_bound(base: type) -> Any:
    """An empty ``bound_class(base)`` object, its state set by unpickling."""
    cls: Any = bound_class(base)
    return cls.__new__(cls)


def job_arguments(env: JobEnv) -> dict[str, Any]:
    """The ``MLFlowLogger`` arguments that point a logger at ``env``'s run and store."""
    if env.tracking_uri is None or env.run_id is None:
        raise ValueError(
            f"JobEnv is not bound to an MLflow run ({env.tracking_uri=}, {env.run_id=}); "
            "check env.recording before binding an MLflow logger."
        )
    return {"tracking_uri": env.tracking_uri, "run_id": env.run_id, "synchronous": True}


def bound_logger(namespace: Namespace, env: JobEnv) -> Any:
    """A new ``MLFlowLogger`` of ``namespace``, bound to ``env``'s run; ``env.recording``."""
    arguments = job_arguments(env)
    # before the logger builds its client: on a database URI that loads MLflow's SQL store,
    # which warns (in the job, the first thing to touch the store is this logger)
    ignore_mlflow_sqlalchemy_deprecation()
    return bound_class(namespace.mlflow_logger_class)(**arguments, log_model=False)


class RunBoundMLFlowLogger(RunBinding, MLFlowLogger):
    """A ``pytorch_lightning`` ``MLFlowLogger`` bound to an existing run (see ``RunBinding``).

    For a Trainer of the app's own making in that namespace; ``fit`` and furcate jobs bind a
    logger of whichever namespace the app's Trainer is.

    Args:
        tracking_uri: The run's tracking URI. Always passed: ``MLFlowLogger``'s default is read from
            the environment when Lightning is imported, which in a forked job is the server's.
        run_id: The existing run to log into.
        prefix: Put before every metric key, as in ``MLFlowLogger``.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, prefix: str = "") -> None:
        ignore_mlflow_sqlalchemy_deprecation()
        super().__init__(
            tracking_uri=tracking_uri,
            run_id=run_id,
            prefix=prefix,
            log_model=False,
            synchronous=True,
        )

    @classmethod
    def from_env(cls, env: JobEnv) -> RunBoundMLFlowLogger:
        """The logger for ``env``'s run; ``env.recording`` must be true."""
        arguments = job_arguments(env)
        return cls(arguments["tracking_uri"], arguments["run_id"])
