"""The furcate launcher: Hydra's entry point; the work happens in ``_core``."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from furcate_hydra.hydra_layer.launch_session import LaunchSession


class FurcateLauncher(Launcher):
    """Runs each job in a fresh process on a pool of GPU (or CPU) slots.

    Besides Hydra's batch ``launch``, it offers ``submit``/``wait_any`` (inside ``streaming``)
    so that furcate's sweepers can hand a slot its next job the moment the previous one ends.
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        self._session: LaunchSession | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from furcate_hydra.hydra_layer.launch_session import launch

        return launch(self.session(), job_overrides, initial_job_idx)

    def submit(self, overrides: Sequence[str], job_num: int) -> str:
        """Queue one job; returns its key. Results come back from ``wait_any``."""
        return self.session().submit(overrides, job_num)

    def submit_batch(self, jobs: Sequence[tuple[Sequence[str], int]]) -> list[str]:
        """Queue ``(overrides, job_num)`` pairs with one store lookup for all of them."""
        return self.session().submit_batch(jobs)

    def wait_any(self, timeout: float | None = None) -> list[tuple[str, JobReturn]]:
        """Wait until at least one submitted job ends; return ``(key, JobReturn)`` pairs."""
        return self.session().wait_any(timeout)

    @property
    def slot_count(self) -> int:
        """How many jobs run at once."""
        return len(self.session().plan.slots)

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """Wrap a sweeper's submits and waits: logging and sweep dir first, every job stopped
        on Ctrl-C or SIGTERM, the sweep's run data written at the end."""
        from furcate_hydra.hydra_layer.launch_session import streaming

        with streaming(self.session()):
            yield

    def job_run(self, key: str) -> tuple[str | None, bool]:
        """The MLflow run of a submitted job (None when not recording), and whether the job was
        skipped because that run had already FINISHED it."""
        return self.session().recorder.job_run(key)

    @property
    def tracking_uri(self) -> str | None:
        """Where jobs are recorded, or None when MLflow recording is off."""
        return self.session().recorder.tracking_uri

    @property
    def sweep_run_id(self) -> str | None:
        """The MLflow run of the sweep, parent of every job's run (once a job was submitted)."""
        return self.session().recorder.sweep_run_id

    def config_files_changed(self) -> None:
        """Compose jobs submitted from now on from the config files as they are now."""
        if self._session is not None:
            self._session.composer.forget()

    def session(self) -> LaunchSession:
        """The warm pool, started on first use and stopped when the launcher goes away."""
        if self._session is None:
            from furcate_hydra.hydra_layer.launch_session import LaunchSession

            if self.hydra_context is None or self.task_function is None or self.config is None:
                raise RuntimeError("FurcateLauncher.setup() must be called before launching jobs")
            self._session = LaunchSession(
                self.options, self.hydra_context, self.task_function, self.config
            )
            # Also at interpreter exit; the fork server stops its jobs if we vanish without it.
            self._finalizer = weakref.finalize(self, self._session.close)
        return self._session

    def close(self) -> None:
        """Stop the warm pool and every job still running; idempotent."""
        if self._finalizer is not None:
            self._finalizer()
