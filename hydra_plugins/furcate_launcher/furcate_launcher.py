"""The furcate launcher: Hydra's entry point; the work happens in ``furcate_hydra.launching``."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from furcate_hydra.launching.compose import SweepComposer
    from furcate_hydra.launching.launch_session import LaunchSession
    from furcate_hydra.launching.launcher_options import LauncherOptions
    from furcate_hydra.launching.streaming import JobRequest, JobRun


class FurcateLauncher(Launcher):
    """Runs each job in a fresh process on a pool of GPU (or CPU) slots.

    Besides Hydra's batch ``launch``, it is a ``StreamingLauncher`` (``submit_batch`` and
    ``wait_any`` inside ``streaming``), so furcate's sweepers hand a slot its next job the moment
    the previous one ends.
    """

    def __init__(self, **options: Any) -> None:
        self.raw_options = options
        self.options: LauncherOptions | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        self._session: LaunchSession | None = None
        self._composer: SweepComposer | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @staticmethod
    def parse_options(options: Mapping[str, Any]) -> LauncherOptions:
        """``hydra.launcher`` as typed options (missing keys at the config's defaults)."""
        from furcate_hydra.hydra_api.options import with_defaults
        from furcate_hydra.launching.launcher_options import LauncherOptions
        from hydra_plugins.furcate_launcher.config import FurcateLauncherConf

        options = with_defaults(FurcateLauncherConf, options, "hydra/launcher=furcate")
        return LauncherOptions.parse(options)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        # Here, not in __init__, where Hydra would wrap the error in its own: a bad option stops
        # the app with a plain message before anything starts.
        self.options = self.parse_options(self.raw_options)
        if self.options.fast_exit:
            self._end_quickly()
        if self.options.backend.value == "slurm":  # the login node: allocations run it all
            from furcate_hydra.slurm.submit_sweep import submit_sweep

            submit_sweep(self.options, config)
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from furcate_hydra.launching.launch import check_batch_paths, launch

        # before the pool starts: a batch refused for where it writes costs no warm-up
        sweep_dir = str(self._setup()[-1].hydra.sweep.dir)
        check_batch_paths(self.composer(), sweep_dir, job_overrides, initial_job_idx)
        return launch(self.session(), job_overrides, initial_job_idx)

    # -- StreamingLauncher ---------------------------------------------------------------

    @property
    def slot_count(self) -> int:
        return self.session().executor.slot_count

    @property
    def jobs_ahead(self) -> int:
        return self.session().jobs_ahead

    @property
    def tracking_uri(self) -> str | None:
        return self.session().ledger.tracking_uri

    @property
    def sweep_run_id(self) -> str | None:
        return self.session().ledger.sweep_run_id

    @contextmanager
    def streaming(self) -> Iterator[None]:
        with self.session().streaming():
            yield

    def warm_up(self) -> None:
        self.session().warm_up()

    def submit_batch(self, jobs: Sequence[JobRequest]) -> list[str]:
        return [job.key for job in self.session().submit_batch(jobs)]

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        return self.session().wait_any(timeout)

    def job_run(self, key: str) -> JobRun:
        return self.session().job_run(key)

    def sweep_status(
        self, to_come: int | None = None, best: str | None = None, pruned: int | None = None
    ) -> None:
        self.session().sweep_status(to_come, best, pruned)

    def job_pruned(self, key: str, epoch: int | None) -> None:
        self.session().job_pruned(key, epoch)

    def config_files_changed(self) -> None:
        if self._composer is not None:
            self._composer.forget()

    # -- lifetime ------------------------------------------------------------------------

    def composer(self) -> SweepComposer:
        """What composes the jobs' configs, the session's and the checks' before it."""
        if self._composer is None:
            from furcate_hydra.launching.compose import SweepComposer

            _, hydra_context, _, config = self._setup()
            self._composer = SweepComposer(hydra_context, config)
        return self._composer

    def session(self) -> LaunchSession:
        """The warm pool, started on first use and stopped when the launcher goes away."""
        if self._session is None:
            from furcate_hydra.launching.launch_session import LaunchSession

            self._session = LaunchSession.start(*self._setup(), self.composer())
            # Also at interpreter exit; the fork server stops its jobs if we vanish without it.
            self._finalizer = weakref.finalize(self, self._session.close)
        return self._session

    def _setup(self) -> tuple[LauncherOptions, HydraContext, TaskFunction, DictConfig]:
        if (
            self.options is None
            or self.hydra_context is None
            or self.task_function is None
            or self.config is None
        ):
            raise RuntimeError("FurcateLauncher.setup() must be called before launching jobs")
        return self.options, self.hydra_context, self.task_function, self.config

    def _end_quickly(self) -> None:
        """At the process's exit: this launcher's sweep ended and recorded, then MLflow's
        connections closed, then the rest of the heap left to the system (quick_exit)."""
        from furcate_hydra.quick_exit import close_at_exit, end_quickly
        from furcate_hydra.store.opened_in_process import close_mlflow_connections

        end_quickly()
        close_at_exit(self.close)
        close_at_exit(close_mlflow_connections)  # (moved after every launcher's close)

    def close(self) -> None:
        """Stop the warm pool and every job still running; idempotent."""
        if self._finalizer is not None:
            self._finalizer()
