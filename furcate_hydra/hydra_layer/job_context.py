"""The Hydra side of a job: what the fork server holds warm and what each forked job runs."""

from __future__ import annotations

import pickle
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction

__all__ = ["HydraJobContext", "JobOutcome", "RemoteTraceback", "job_payload"]


class RemoteTraceback(Exception):
    """The traceback of an exception raised inside a job's process, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nTraceback from the job's process:\n{self.text}"


def job_payload(sweep_config: Any) -> bytes:
    """What one job's process unpickles: its composed config. Its environment (run, dirs,
    trial) travels in the job's record and is set by the executor before the job starts."""
    return pickle.dumps(sweep_config)


@dataclass
class JobOutcome:
    """A job's JobReturn plus, when it failed, its traceback as text (exceptions lose theirs)."""

    job_return: JobReturn
    traceback: str | None = None


class HydraJobContext:
    """Task function, Hydra context and singleton state: shipped once, kept warm in the server."""

    def __init__(
        self, task_function: TaskFunction, hydra_context: HydraContext, singleton_state: Any
    ) -> None:
        self.task_function = task_function
        self.hydra_context = hydra_context
        self.singleton_state = singleton_state

    def prepare(self) -> None:
        # Done once in the server so every forked job inherits the resolvers and singletons.
        setup_globals()
        Singleton.set_state(self.singleton_state)

    def run(self, payload: bytes) -> JobOutcome:
        job_return = run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=pickle.loads(payload),
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        if job_return.status != JobStatus.FAILED:
            return JobOutcome(job_return)
        error = job_return._return_value
        text = "".join(traceback.format_exception(error))
        # Also into the job's stderr.log, next to whatever the job printed before failing.
        print(text, file=sys.stderr, flush=True)
        if not _picklable(error):
            job_return.return_value = RuntimeError(f"{type(error).__qualname__}: {error}")
        return JobOutcome(job_return, text)


def _picklable(value: object) -> bool:
    try:
        pickle.loads(cloudpickle.dumps(value))
    except Exception:
        return False
    return True
