"""What the launcher tells a job through its environment, read once into a value."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra import env_vars as _names

__all__ = [
    "CHECKPOINT_DIR_VAR",
    "EXPERIMENT_ID_VAR",
    "OUTPUT_DIR_VAR",
    "RUN_ID_VAR",
    "TRACKING_URI_VAR",
    "JobEnv",
]

log = logging.getLogger(__name__)

# one spelling, shared with the launcher that sets them
TRACKING_URI_VAR = _names.TRACKING_URI
RUN_ID_VAR = _names.RUN_ID
EXPERIMENT_ID_VAR = _names.EXPERIMENT_ID
OUTPUT_DIR_VAR = _names.OUTPUT_DIR
CHECKPOINT_DIR_VAR = _names.CHECKPOINT_DIR

CHECKPOINT_SUBDIR = "checkpoints"


@dataclass(frozen=True)
class JobEnv:
    """Where a job writes, and the MLflow run it records into (if any).

    Attributes:
        output_dir: The job's output directory (Hydra's job dir), absolute.
        checkpoint_dir: Where this run's checkpoints live; stable across relaunches of the run.
        tracking_uri: MLflow tracking URI, or None outside the launcher.
        run_id: The MLflow run the launcher created for this job, or None.
        experiment_id: That run's experiment, or None.
    """

    output_dir: Path
    checkpoint_dir: Path
    tracking_uri: str | None = None
    run_id: str | None = None
    experiment_id: str | None = None

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

        output = get(OUTPUT_DIR_VAR)
        output_dir = Path(output) if output else (default_output_dir or Path.cwd())
        output_dir = output_dir.absolute()
        checkpoint = get(CHECKPOINT_DIR_VAR)
        checkpoint_dir = Path(checkpoint) if checkpoint else output_dir / CHECKPOINT_SUBDIR
        env = cls(
            output_dir=output_dir,
            checkpoint_dir=checkpoint_dir.absolute(),
            tracking_uri=get(TRACKING_URI_VAR),
            run_id=get(RUN_ID_VAR),
            experiment_id=get(EXPERIMENT_ID_VAR),
        )
        if env.run_id is not None and env.tracking_uri is None:
            log.warning(
                "%s=%s is set but %s is not, so this job records nothing in MLflow. "
                "Set both, or neither to run standalone.",
                RUN_ID_VAR,
                env.run_id,
                TRACKING_URI_VAR,
            )
        return env
