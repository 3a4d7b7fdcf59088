"""``OptunaPruning``: report a job's monitored metric to its Optuna trial and stop when pruned.

sweeper (parent): study.ask() ──► env: storage URL, study name, trial number, monitor, pruner,
                  and, for jobs on its machine, the URL of its prune service
job: each validation ──► POST {trial, step, value} to the sweeper ──► prune? ──► should_stop
     (no service, or it does not answer: trial.report(value, epoch) ──► pruner.prune? itself)
job returns normally ──► the sweeper reads ``PRUNED_AT_EPOCH_ATTR`` and tells the trial PRUNED

The trial is named by its **number**, not its storage id: ``Trial.number`` is public in the
parent (the id is private) and is what Optuna's logs and dashboard show; the job maps it to the
id through the storage. The **pruner** is not kept in the storage, so the job rebuilds it: from
the constructor's ``pruner`` argument, or in ``from_environ`` from ``FURCATE_OPTUNA_PRUNER``, a
JSON object ``{"name": "median", "n_startup_trials": 5, ...}`` (see :func:`pruner_from_spec`);
unset means Optuna's default, ``MedianPruner()``.

Pruning never raises ``optuna.TrialPruned`` inside Lightning: that would fail ``fit`` and lose
the final checkpoint and the MLflow artifacts. Only rank zero talks to the storage, once per
validation; it opens the storage lazily, once per job, with a busy timeout for sqlite.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import optuna
import sqlalchemy.exc
from optuna.pruners import BasePruner

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.lightning._namespace import CallbackBase
from furcate_hydra.tuning.proxy import open_job_storage
from furcate_hydra.tuning.pruners import pruner_from_spec

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["OptunaPruning"]

_LOCKED_RETRIES = 5
# A report to the sweeper's prune service takes milliseconds; a sweeper this slow is stuck.
_SERVICE_TIMEOUT_S = 60.0

T = TypeVar("T")


class OptunaPruning(CallbackBase):
    """Report ``monitor`` after each validation to a RUNNING trial; stop training when pruned.

    Outside a trial of the Optuna sweeper (``from_environ`` in a callbacks config shared with
    single runs) it is inactive and does nothing. A ``monitor`` the job never logs warns once,
    naming the metrics it does log, and the trial is not pruned.

    Args:
        storage: Optuna RDB storage URL, e.g. ``sqlite:///optuna.db``, or the sweeper's
            gRPC proxy in front of it, ``grpc://HOST:PORT`` (jobs on other machines); None:
            inactive.
        study_name: The study the trial belongs to.
        trial_number: ``Trial.number`` of the RUNNING trial the sweeper asked for this job.
        monitor: Key in ``trainer.callback_metrics`` to report, e.g. ``val_loss``.
        pruner: The study's pruner; Optuna's default ``MedianPruner()`` when None.
        service_url: The sweeper's prune service (``tuning/prune_service.py``), which reports
            and decides on the study it holds: a job at 50,000 trials then does not load
            every trial to decide. None, or no answer from it: the job uses ``storage``.
        service_token: The trial's token, sent with each report to the service (it takes
            reports for this trial with it alone).

    Several jobs may report to one sqlite file at once: each opens one connection pool, waits
    up to ``SQLITE_BUSY_TIMEOUT_S`` for the lock, and retries a write that sqlite refused at
    once ("database is locked" on a lock upgrade, which the timeout does not cover). Pruning is
    single-objective in Optuna: with several directions the callback warns once and does
    nothing.

    Attributes:
        reported: Epoch -> value this job reported.
        pruned_at_epoch: The epoch whose value got the trial pruned, or None.
    """

    def __init__(
        self,
        storage: str | None,
        study_name: str = "",
        trial_number: int = -1,
        monitor: str = "",
        pruner: BasePruner | None = None,
        service_url: str | None = None,
        service_token: str | None = None,
    ) -> None:
        self.storage = storage
        self.service_url = service_url
        self._service_token = service_token
        self.study_name = study_name
        self.trial_number = trial_number
        self.monitor = monitor
        self.pruner = pruner if pruner is not None else optuna.pruners.MedianPruner()
        self.reported: dict[int, float] = {}
        self.pruned_at_epoch: int | None = None
        self._trial: optuna.Trial | None = None
        self._trial_id = -1
        self._storage: optuna.storages.BaseStorage | None = None
        self._multi_objective = False
        self._monitor_missing = False

    @property
    def pruned(self) -> bool:
        """True once the pruner asked this trial to stop."""
        return self.pruned_at_epoch is not None

    @property
    def active(self) -> bool:
        """False outside a trial of the Optuna sweeper: the callback then does nothing."""
        return self.storage is not None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> OptunaPruning:
        """The callback the Optuna sweeper asked for; inactive (it does nothing) in a job or
        run it did not launch, so one callbacks config serves sweeps and single runs.

        Raises:
            FurcateConfigError: Only some of the variables are set, or one is malformed.
        """
        source = os.environ if env is None else env
        names = (
            env_vars.OPTUNA_STORAGE,
            env_vars.OPTUNA_STUDY,
            env_vars.OPTUNA_TRIAL_NUMBER,
            env_vars.OPTUNA_MONITOR,
        )
        values = {name: source.get(name) or None for name in names}
        missing = [name for name, value in values.items() if value is None]
        if len(missing) == len(names):
            return cls(None)
        if missing:
            raise FurcateConfigError(
                missing[0],
                None,
                f"the Optuna sweeper sets all of {list(names)}; {missing} unset",
                "set all of them, or none to run without pruning",
            )
        number = str(values[env_vars.OPTUNA_TRIAL_NUMBER])
        try:
            trial_number = int(number)
        except ValueError:
            trial_number = -1
        if trial_number < 0:
            raise FurcateConfigError(
                env_vars.OPTUNA_TRIAL_NUMBER,
                number,
                "must be a trial number (an integer >= 0)",
                "set it to the asked trial's Trial.number",
            )
        spec = source.get(env_vars.OPTUNA_PRUNER) or None
        return cls(
            storage=str(values[env_vars.OPTUNA_STORAGE]),
            study_name=str(values[env_vars.OPTUNA_STUDY]),
            trial_number=trial_number,
            monitor=str(values[env_vars.OPTUNA_MONITOR]),
            pruner=pruner_from_spec(spec) if spec is not None else None,
            service_url=source.get(env_vars.OPTUNA_PRUNE_URL) or None,
            service_token=source.get(env_vars.OPTUNA_PRUNE_TOKEN) or None,
        )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # only fit's validations are the trial's epochs: not the app's trainer.validate() after
        if trainer.sanity_checking or not self.active or trainer.state.fn != "fit":
            return
        prune = False
        if trainer.is_global_zero:
            value = self._metric(trainer)
            if value is not None:
                prune = self.report(value, trainer.current_epoch)
        # every rank must stop together, or the others wait forever in their next collective
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True

    def report(self, value: float, epoch: int) -> bool:
        """Report ``value`` for ``epoch``; True (and recorded) when the pruner says stop."""
        if not self.active:
            return False
        if self.service_url is not None:
            decided = self._ask_service(self.service_url, value, epoch)
            if decided is not None:
                self.reported[epoch] = float(value)
                if decided and self.pruned_at_epoch is None:
                    self.pruned_at_epoch = epoch
                return decided
        trial = self._open()
        if trial is None:
            return False
        self.reported[epoch] = float(value)
        _retry_locked(lambda: trial.report(value, step=epoch))
        if not _retry_locked(trial.should_prune):
            return False
        if self.pruned_at_epoch is None and self._storage is not None:
            self.pruned_at_epoch = epoch
            storage = self._storage
            _retry_locked(
                lambda: storage.set_trial_system_attr(
                    self._trial_id, env_vars.PRUNED_AT_EPOCH_ATTR, epoch
                )
            )
        return True

    def _ask_service(self, url: str, value: float, epoch: int) -> bool | None:
        """The sweeper's decision (it reported the value to the trial); None when it cannot
        be had: then the job reports to the storage itself, from now on."""
        body = {"trial": self.trial_number, "step": int(epoch), "value": float(value)}
        headers = {"Content-Type": "application/json"}
        if self._service_token is not None:
            headers["Authorization"] = f"Bearer {self._service_token}"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=_SERVICE_TIMEOUT_S) as answer:
                return bool(json.loads(answer.read())["prune"])
        except (OSError, ValueError, KeyError) as exc:  # URLError and HTTPError are OSErrors
            why = str(exc)
            if isinstance(exc, urllib.error.HTTPError):  # the service's own words
                why = exc.read().decode(errors="replace") or why
            self.service_url = None
            warnings.warn(
                f"furcate: the sweeper's pruning service at {url} did not decide trial "
                f"{self.trial_number}'s epoch {epoch} ({why}): this job reports to the study's "
                "storage itself from now on",
                UserWarning,
                stacklevel=2,
            )
            return None

    def _metric(self, trainer: pl.Trainer) -> float | None:
        metrics = trainer.callback_metrics
        if self.monitor in metrics:
            return float(metrics[self.monitor])
        if not self._monitor_missing:
            self._monitor_missing = True
            warnings.warn(
                f"furcate: hydra.sweeper.monitor={self.monitor!r} is not among the metrics this "
                f"job logs after validation ({', '.join(sorted(metrics)) or 'none'}): nothing is "
                "reported to the trial and it is never pruned. Fix: set hydra.sweeper.monitor "
                f"to one of those, or log {self.monitor!r} with self.log() in validation.",
                UserWarning,
                stacklevel=2,
            )
        return None

    def _open(self) -> optuna.Trial | None:
        if self._trial is not None or self._multi_objective:
            return self._trial
        url = str(self.storage)
        storage = _retry_locked(lambda: open_job_storage(url, env_vars.OPTUNA_STORAGE))
        study = _retry_locked(
            lambda: optuna.load_study(
                study_name=self.study_name,
                storage=storage,
                # the job samples nothing; a cheap sampler avoids per-trial sampler work
                sampler=optuna.samplers.RandomSampler(),
                pruner=self.pruner,
            )
        )
        if len(study.directions) > 1:
            self._multi_objective = True
            warnings.warn(
                f"Study {self.study_name!r} has {len(study.directions)} objectives and Optuna "
                f"prunes single-objective studies only: {self.monitor!r} is not reported and "
                "the trial is never pruned.",
                UserWarning,
                stacklevel=2,
            )
            return None
        study_id = _retry_locked(lambda: storage.get_study_id_from_name(self.study_name))
        self._trial_id = _retry_locked(
            lambda: storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number)
        )
        self._storage = storage
        self._trial = _retry_locked(lambda: optuna.Trial(study, self._trial_id))
        return self._trial


def _retry_locked(call: Callable[[], T]) -> T:
    attempt = 0
    while True:
        try:
            return call()
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError) as e:
            attempt += 1
            if "database is locked" not in f"{e} {e.__cause__}" or attempt >= _LOCKED_RETRIES:
                raise
            # jittered, so that jobs refused together do not retry together
            time.sleep(0.05 * 2**attempt * (1 + random.random()))
