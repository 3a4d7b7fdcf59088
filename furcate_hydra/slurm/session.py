"""A launch session inside a Slurm job: its allocation's cores, its runs' tags, its requeue.

SlurmJob.from_environ() ── None: not in Slurm, nothing changes
    └─ a job ─► slots: the allocation's GPUs (CUDA_VISIBLE_DEVICES, as given) and cores
              ─► every run it makes is tagged with the Slurm job and node
              ─► SIGUSR1 (--signal=B:USR1@<s>): its jobs save and are recorded preempted,
                 then ``scontrol requeue`` (hydra.launcher.slurm.requeue) and exit
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.slurm import SlurmJob, SlurmOptions, allocation_cpus, is_requeueable, requeue
from furcate_hydra.store import Tags

log = logging.getLogger(__name__)

__all__ = ["SlurmSession"]

# what `sbatch --signal=B:USR1@<s>` sends the batch shell (the launcher, when job.sh execs it)
# before the time limit; SIGTERM comes later, and also from scancel, so it never requeues
TIME_LIMIT_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class SlurmSession:
    """The Slurm job a launcher runs in, and whether it requeues it when time runs out."""

    job: SlurmJob
    requeue: bool | None

    @classmethod
    def detect(
        cls, options: SlurmOptions, environ: Mapping[str, str] | None = None
    ) -> SlurmSession | None:
        """The session's Slurm job, or None outside Slurm.

        Raises:
            FurcateConfigError: ``hydra.launcher.slurm.requeue=true`` outside a Slurm job.
        """
        job = SlurmJob.from_environ(environ)
        if job is None:
            if options.requeue is True:
                raise FurcateConfigError(
                    "hydra.launcher.slurm.requeue",
                    True,
                    "this process is not in a Slurm job (SLURM_JOB_ID is unset), so there is "
                    "no job to requeue",
                    "run the sweep inside an sbatch job script, or leave "
                    "hydra.launcher.slurm.requeue unset (null)",
                )
            return None
        return cls(job, options.requeue)

    def cpus(self) -> list[int]:
        """The cores the session's slots share: the allocation's."""
        return allocation_cpus(self.job, sorted(os.sched_getaffinity(0)))

    def tags(self) -> dict[str, str]:
        """Tags of every run the session makes: which Slurm job and node it ran in."""
        tags = {Tags.SLURM_JOB: self.job.label}
        if self.job.node:
            tags[Tags.SLURM_NODE] = self.job.node
        return tags

    def preempted_by(self, signum: int) -> str | None:
        """Why the session's jobs are preempted, for their runs, if ``signum`` is Slurm's
        time-limit signal; None for any other stop (Ctrl-C, SIGTERM, scancel)."""
        if signum != TIME_LIMIT_SIGNAL:
            return None
        return f"preempted: {self.job.describe()} reached its time limit (SIGUSR1)"

    def requeue_now(self) -> bool:
        """Requeue the job if the option says so (unset: if Slurm would); True if requeued."""
        wanted = self.requeue if self.requeue is not None else is_requeueable(self.job)
        if not wanted:
            why = (
                "hydra.launcher.slurm.requeue=false"
                if self.requeue is False
                else ("the job is not requeueable (sbatch --no-requeue, or JobRequeue=0)")
            )
            log.warning("furcate: %s is not requeued: %s", self.job.describe(), why)
            return False
        return requeue(self.job)
