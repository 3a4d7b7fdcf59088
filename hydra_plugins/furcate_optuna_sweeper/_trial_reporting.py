"""Where a trial's job reports its monitored metric per epoch, for the pruner.

jobs on this machine, furcate's local backend, one objective ──► the prune service: the
    sweeper decides (furcate_hydra/tuning/prune_service.py)
jobs on Ray nodes, a sqlite study ──► Optuna's gRPC proxy in front of it, served while the
    trials run (hydra.sweeper.storage_proxy), to jobs given this sweep's token
otherwise ──► the study's storage itself
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import optuna
from omegaconf import DictConfig

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.hydra_api.options import as_option_error, plain
from furcate_hydra.sweepers.storage_proxy import sweeper_storage_proxy
from hydra_plugins.furcate_optuna_sweeper._options import OptunaOptions
from hydra_plugins.furcate_optuna_sweeper._study import shown_url

if TYPE_CHECKING:
    from furcate_hydra.tuning.prune_service import PruneService

__all__ = ["TrialReporting"]

log = logging.getLogger(__name__)


class TrialReporting:
    """What a trial's job is told to report to (``env``), and what hears it (``serving``)."""

    def __init__(
        self,
        options: OptunaOptions,
        config: DictConfig,
        storage: str,
        study_name: str,
        streaming: bool,
    ) -> None:
        self.options = options
        self.config = config
        self.storage = storage
        self.study_name = study_name
        self.streaming = streaming  # the furcate launcher: jobs are where its backend says
        # jobs on other machines report to the study (pruning): it must be reachable there,
        # a sqlite file through the proxy `serving` starts
        self._serve_at = sweeper_storage_proxy(
            plain(config.hydra.get("launcher")),
            "hydra.sweeper.storage",
            storage,
            options.storage_proxy,
        )
        self.job_storage = storage  # what the trials' jobs open
        self._proxy_env: dict[str, str] = {}  # the proxy's token (and certificate), while served
        self._prune_service: PruneService | None = None  # while trials run here (serving)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While the trials run: pruning decided here for jobs on this machine, or the sqlite
        study served to the Ray nodes, if they need it."""
        if self._serve_at is None:
            with self._deciding_pruning():
                yield
            return
        from furcate_hydra.tuning.proxy import StudyProxy

        host, port = self._serve_at
        tls = self.options.storage_proxy_tls
        try:
            proxy = StudyProxy(
                self.storage,
                host,
                port,
                "hydra.sweeper.storage_proxy",
                token=secrets.token_urlsafe(32),  # this sweep's alone; jobs get it in env()
                tls=tls,
            )
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        self.job_storage = proxy.url
        self._proxy_env = proxy.job_env()
        log.info(
            "furcate_optuna: the study is served to the Ray nodes at %s (Optuna's gRPC proxy "
            "in front of %s, for this sweep's jobs only; %s)",
            proxy.url,
            shown_url(self.storage),
            "over TLS"
            if tls is not None
            else "in clear text, token included: hydra.sweeper.storage_proxy_tls_cert and _key "
            "set TLS",
        )
        try:
            yield
        finally:
            proxy.stop()
            self.job_storage = self.storage
            self._proxy_env = {}
            log.info("furcate_optuna: stopped serving the study at %s", proxy.url)

    @contextlib.contextmanager
    def _deciding_pruning(self) -> Iterator[None]:
        """The prune service (tuning/prune_service.py), where jobs run on this machine under
        furcate's launcher and a monitored metric can prune a single-objective study."""
        launcher = plain(self.config.hydra.get("launcher")) or {}
        local = self.streaming and launcher.get("backend", "local") == "local"
        if not (local and self.options.monitor and len(self.options.directions) == 1):
            yield
            return
        from furcate_hydra.tuning.prune_service import PruneService

        self._prune_service = PruneService()
        log.debug("furcate_optuna: jobs report to %s", self._prune_service.url)
        try:
            yield
        finally:
            self._prune_service.stop()
            self._prune_service = None

    @property
    def prunes_here(self) -> bool:
        """Whether this process decides its trials' pruning (a thread of its own serves it
        from the first trial on)."""
        return self._prune_service is not None

    def env(self, trial: optuna.Trial) -> dict[str, str]:
        """What the job's pruning callback reads to report to its trial (nothing to report
        without a monitored metric)."""
        if self.options.monitor is None:
            return {}
        env = {
            env_vars.OPTUNA_STORAGE: self.job_storage,
            env_vars.OPTUNA_STUDY: self.study_name,
            env_vars.OPTUNA_TRIAL_NUMBER: str(trial.number),
            env_vars.OPTUNA_MONITOR: self.options.monitor,
            env_vars.OPTUNA_PRUNER: self.options.pruner_json(),
            **self._proxy_env,
        }
        if self._prune_service is not None:
            self._prune_service.add(trial)
            env[env_vars.OPTUNA_PRUNE_URL] = self._prune_service.url
            env[env_vars.OPTUNA_PRUNE_TOKEN] = self._prune_service.token(trial.number)
        return env

    def ended(self, trial: optuna.Trial) -> None:
        """The trial's job has ended: it reports no more."""
        if self._prune_service is not None:
            self._prune_service.discard(trial)
