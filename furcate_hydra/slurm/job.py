"""The Slurm job this process runs in, as Slurm's environment tells it (pure: no command runs).

Slurm exports ``SLURM_JOB_ID`` (an array task's own id), ``SLURM_ARRAY_JOB_ID`` and
``SLURM_ARRAY_TASK_ID`` for an array, ``SLURMD_NODENAME``, ``SLURM_CPUS_ON_NODE`` (the CPUs of the
allocation on this node) and ``SLURM_RESTART_COUNT`` (times the job was requeued) to every
process of a job. The GPUs need nothing here: Slurm's GRES hands them out through
``CUDA_VISIBLE_DEVICES``, with node-wide ids (``2,3``), which the slot planner takes as given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SlurmJob", "allocation_cpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlurmJob:
    """Who this launcher is in Slurm: its job, its node, its CPUs, how often it was requeued."""

    job_id: str
    array_job_id: str | None = None
    array_task_id: str | None = None
    node: str | None = None
    cpus_on_node: int | None = None
    restart_count: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SlurmJob | None:
        """The job of ``environ`` (default: this process's), or None outside Slurm."""
        env = os.environ if environ is None else environ
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if not job_id:
            return None
        return cls(
            job_id=job_id,
            array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
            array_task_id=env.get("SLURM_ARRAY_TASK_ID") or None,
            node=env.get("SLURMD_NODENAME") or env.get("SLURM_NODELIST") or None,
            cpus_on_node=_count(env.get("SLURM_CPUS_ON_NODE")),
            restart_count=_count(env.get("SLURM_RESTART_COUNT")) or 0,
        )

    @property
    def label(self) -> str:
        """How ``squeue`` and ``sacct`` name it: ``12`` or, an array's task, ``12_3``."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        again = f", requeued {self.restart_count}x" if self.restart_count else ""
        return f"Slurm job {self.label}{where}{again}"


def allocation_cpus(job: SlurmJob, affinity: Sequence[int]) -> list[int]:
    """The cores of the allocation: the process's affinity, which Slurm sets to the
    allocation's cores where its task plugin binds (task/affinity, task/cgroup). On a node
    that does not bind (task/none), the affinity is the whole machine: then the first
    ``SLURM_CPUS_ON_NODE`` of it, so that a sweep takes no more cores than it was given."""
    cores = sorted(set(affinity))
    given = job.cpus_on_node
    if given is None or given >= len(cores):
        return cores
    log.info(
        "furcate: %s has %d CPUs but this process may use %d cores (Slurm did not bind it): "
        "the sweep uses the first %d",
        job.describe(),
        given,
        len(cores),
        given,
    )
    return cores[:given]


def _count(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip())
