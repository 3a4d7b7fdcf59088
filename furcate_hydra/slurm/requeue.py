"""Requeue the Slurm job this launcher runs in: ``scontrol requeue``, once its jobs are saved.

    SIGUSR1 (``--signal=B:USR1@<s>``) ──► the launcher stops every job (each saves a
    checkpoint), records them preempted ──► ``scontrol requeue <job>`` ──► exit
    Slurm runs the job again (same id, ``SLURM_RESTART_COUNT`` + 1): the same command resumes
    each config from its checkpoint and skips what finished.

Requeueing a running job ends the processes of its current run, so it is the launcher's last
act, after the store has every record.
"""

from __future__ import annotations

import logging
import subprocess

from furcate_hydra.slurm.job import SlurmJob

__all__ = ["is_requeueable", "requeue"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0


def is_requeueable(job: SlurmJob) -> bool:
    """Whether Slurm would requeue the job (``Requeue=1``: ``--requeue``, or the cluster's
    ``JobRequeue=1`` default without ``--no-requeue``); False if ``scontrol`` cannot tell."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-o", job.job_id],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("furcate: could not ask Slurm whether %s is requeueable: %s", job.label, exc)
        return False
    fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
    return fields.get("Requeue") == "1"


def requeue(job: SlurmJob) -> bool:
    """``scontrol requeue`` the job; True if Slurm took it. Logs why not otherwise."""
    try:
        done = subprocess.run(
            ["scontrol", "requeue", job.job_id],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.error("furcate: could not requeue %s: %s", job.describe(), exc)
        return False
    if done.returncode != 0:
        log.error(
            "furcate: scontrol requeue %s failed (exit %d): %s",
            job.job_id,
            done.returncode,
            (done.stderr or done.stdout).strip(),
        )
        return False
    return True
