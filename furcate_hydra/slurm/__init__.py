"""furcate under Slurm: the job a launcher runs in, its requeue when time runs out, and the
``backend=slurm`` submission from a login node.

Imports no Hydra; ``scontrol`` and ``sbatch`` run as commands, only when asked.
"""

from __future__ import annotations

from furcate_hydra.slurm.job import SlurmJob, allocation_cpus
from furcate_hydra.slurm.options import SlurmOptions
from furcate_hydra.slurm.requeue import is_requeueable, requeue

__all__ = ["SlurmJob", "SlurmOptions", "allocation_cpus", "is_requeueable", "requeue"]
