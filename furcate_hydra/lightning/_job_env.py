"""What the launcher tells a job through its environment, read once into a value."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.layout import JobPaths

__all__ = ["JobEnv"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobEnv:
    """Where a job writes, and the MLflow run it records into (if any).

    Attributes:
        output_dir: The job's output directory (Hydra's job dir), absolute.
        checkpoint_dir: Where this run's checkpoints live; stable across relaunches of the run.
        tracking_uri: MLflow tracking URI, or None outside the launcher.
        run_id: The MLflow run the launcher created for this job, or None.
        experiment_id: That run's experiment, or None.
        checkpoint_every_n_steps: Save within an epoch every this many optimizer steps, or
            None (``hydra.launcher.checkpoint_every_n_steps``).
        checkpoint_every_s: Save within an epoch every this many seconds, or None
            (``hydra.launcher.checkpoint_every_s``).
        resumed_output_dir: For a resumed run, the job dir of its previous attempt (where
            the app's own checkpoints of that attempt are), else None.
        progress_every_s: Least seconds between two progress writes while batches run
            (the launcher asks for 1 s under ``jobs_per_gpu=auto``, which reads steps/s there).
    """

    output_dir: Path
    checkpoint_dir: Path
    tracking_uri: str | None = None
    run_id: str | None = None
    experiment_id: str | None = None
    checkpoint_every_n_steps: int | None = None
    checkpoint_every_s: float | None = None
    resumed_output_dir: Path | None = None
    progress_every_s: float = 5.0

    @property
    def paths(self) -> JobPaths:
        """Every file of the job (history, plots, final checkpoint, ...)."""
        return JobPaths(self.output_dir, self.checkpoint_dir)

    @property
    def recording(self) -> bool:
        """True when the job is bound to an MLflow run."""
        return self.run_id is not None and self.tracking_uri is not None

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        default_output_dir: Path | None = None,
    ) -> JobEnv:
        """Read the launcher's variables; absent or empty ones fall back to running standalone.

        Args:
            environ: The variables to read; ``os.environ`` (read now, not at import) by default.
            default_output_dir: Output dir when ``FURCATE_OUTPUT_DIR`` is absent; else the cwd.

        Returns:
            The job's environment, with absolute directories.
        """
        source = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            # an exported-but-empty variable means "unset", as it does for MLflow itself
            return source.get(name) or None

        output = get(env_vars.OUTPUT_DIR)
        paths = JobPaths.of(
            Path(output) if output else (default_output_dir or Path.cwd()),
            get(env_vars.CHECKPOINT_DIR),
        )
        env = cls(
            output_dir=paths.output_dir,
            checkpoint_dir=paths.checkpoint_dir,
            tracking_uri=get(env_vars.TRACKING_URI),
            run_id=get(env_vars.RUN_ID),
            experiment_id=get(env_vars.EXPERIMENT_ID),
            checkpoint_every_n_steps=_number(
                env_vars.CHECKPOINT_EVERY_N_STEPS, get(env_vars.CHECKPOINT_EVERY_N_STEPS), int
            ),
            checkpoint_every_s=_number(
                env_vars.CHECKPOINT_EVERY_S, get(env_vars.CHECKPOINT_EVERY_S), float
            ),
            resumed_output_dir=_path(get(env_vars.RESUMED_OUTPUT_DIR)),
            progress_every_s=_number(
                env_vars.PROGRESS_EVERY_S, get(env_vars.PROGRESS_EVERY_S), float
            )
            or 5.0,
        )
        if env.run_id is not None and env.tracking_uri is None:
            log.warning(
                "%s=%s is set but %s is not, so this job records nothing in MLflow. "
                "Set both, or neither to run standalone.",
                env_vars.RUN_ID,
                env.run_id,
                env_vars.TRACKING_URI,
            )
        return env


def _path(text: str | None) -> Path | None:
    return Path(os.path.abspath(text)) if text else None


def _number(name: str, text: str | None, kind: type[int] | type[float]) -> Any:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or not math.isfinite(value):
        raise FurcateConfigError(
            name, text, f"must be a positive {kind.__name__}", f"unset {name} or set e.g. {name}=60"
        )
    return value
