"""How a preempted job tells its launcher so: it saved a checkpoint and asks to run again.

    scheduler ──SIGTERM / SIGUSR1──► job (fit): finish the step, save a checkpoint,
                                     raise JobPreempted ──► exit status PREEMPTED_EXIT_CODE
    launcher ◄── the job's report says preempted ──► PREEMPTED: re-queued, it resumes

Shared by the job's side (``furcate_hydra.lightning``), which raises it, and the executor's
(``furcate_hydra.execution``), which reads it; neither imports the other.
"""

from __future__ import annotations

import signal

__all__ = ["PREEMPTED_EXIT_CODE", "PREEMPTION_SIGNALS", "JobPreempted"]

# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry later".
PREEMPTED_EXIT_CODE = 75
# SIGTERM: what schedulers and `kill` send first; SIGUSR1: SLURM's `--signal=USR1@<seconds>`.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class JobPreempted(SystemExit):
    """Raised by a job asked to stop from outside once it has saved where it is.

    A ``SystemExit``: a task's ``except Exception`` does not swallow it, Hydra's ``run_job``
    lets it through, and a job run without the launcher exits quietly with
    ``PREEMPTED_EXIT_CODE``.
    """

    def __init__(self, signal_name: str, checkpoint: str | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal_name = signal_name
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f"saved {self.checkpoint}" if self.checkpoint else "no checkpoint saved"
        return f"preempted by {self.signal_name} ({saved})"
