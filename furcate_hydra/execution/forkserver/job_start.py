"""A job's ``Start`` and its result file, as both transports hand them to a fork server.

    Job + placement ──► job_start ──► Start ──► fork server ──► job process
                                        │                         │ its ChildReport, pickled
                                        └ result_path ◄───────────┘
    Exited ──► ResultFiles.take(name) ──► the report's bytes, read once (None: it wrote none)

The local transport keeps its result files in its runtime dir; a Ray slot actor in its own,
on its node, and sends the bytes back to the launcher.
"""

from __future__ import annotations

from pathlib import Path

from furcate_hydra.execution.forkserver.protocol import Placement, Start
from furcate_hydra.execution.job import Job

__all__ = ["ResultFiles", "job_start"]


def job_start(job: Job, placement: Placement | None, result_path: str, echo: bool) -> Start:
    """The fork server's ``Start`` of ``job``: on ``placement`` (None: forked ahead of a
    slot), its output to its log files (and the console, with ``echo``), its report to
    ``result_path``."""
    return Start(
        key=job.key,
        payload=job.payload,
        env=job.env,
        placement=placement,
        stdout_path=str(job.paths.stdout),
        stderr_path=str(job.paths.stderr),
        result_path=result_path,
        echo=echo,
        secrets=job.secrets,
    )


class ResultFiles:
    """Where the jobs of one fork server write their reports: a file per start, named by
    its owner, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.result"

    def take(self, name: str) -> bytes | None:
        """The report the job wrote, read once (the file is removed); None: it wrote none.

        Raises:
            OSError: the file is there and cannot be read.
        """
        path = self.path(name)
        if not path.exists():
            return None
        try:
            return path.read_bytes()
        finally:
            path.unlink(missing_ok=True)
