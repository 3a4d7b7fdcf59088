"""``hydra.launcher.backend=slurm``: from a login node, N allocations that run the sweep.

    python train.py -m ... hydra.launcher.backend=slurm   (on the login node)
      ──► checks: a store and a study every node reaches
      ──► <sweep dir>/furcate_slurm.sh: the same command, backend=local, one sweep dir per
          allocation ──► sbatch --array=0-(N-1) --gres=gpu:G --signal=B:USR1@S --requeue
      ──► returns (wait=false), or follows the array until it ends (wait=true)
    each allocation: a pool of slots on its GPUs, pulling the sweep's configs from the store
    (claims: each config once); at its time limit it saves, requeues itself, and resumes

``sbatch`` directly, not submitit: submitit runs a pickled Python function in a job step
(``srun``), where Slurm's ``--signal=B:...`` does not reach it, and it has a requeue protocol
of its own; here the launcher is the batch shell, as in a job.sh a user writes, so requeue and
resume are the launcher's, and nothing but Slurm itself is needed.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.slurm.options import KEY, SlurmOptions

__all__ = ["ArrayState", "Submission", "follow", "submit"]

log = logging.getLogger(__name__)

SCRIPT = "furcate_slurm.sh"
# states of a task that is over (squeue lists it no more once MinJobAge passed)
_OVER = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


@dataclass(frozen=True)
class Submission:
    """What each allocation runs: ``command`` in ``cwd`` (the sweep's own overrides, plus
    the local backend), its sweep dir ``sweep_dir`` (allocation 0's; the others' beside it,
    ``<sweep_dir>.<task>``), with ``env`` exported."""

    command: tuple[str, ...]
    cwd: Path
    sweep_dir: Path
    job_name: str
    env: Mapping[str, str]
    options: SlurmOptions

    def script(self) -> str:
        """The batch script: ``exec`` the sweep, so that the launcher is the batch shell and
        gets ``--signal=B:USR1`` (bash would die of it)."""
        sweep = shlex.quote(str(self.sweep_dir))
        lines = [
            "#!/bin/bash",
            "# written by furcate (hydra.launcher.backend=slurm): one allocation of the sweep",
            *(f"export {name}={shlex.quote(value)}" for name, value in self.env.items()),
            *self.options.setup,
            f"cd {shlex.quote(str(self.cwd))}",
            # allocation 0 writes the sweep dir the login node named; the others beside it
            'task="${SLURM_ARRAY_TASK_ID:-0}"',
            f'sweep={sweep}; [ "$task" = 0 ] || sweep={sweep}."$task"',
            "exec "
            + " ".join(shlex.quote(part) for part in self.command)
            + ' "hydra.sweep.dir=$sweep"',
        ]
        return "\n".join(lines) + "\n"

    def sbatch_args(self, script: Path) -> list[str]:
        o = self.options
        args = [
            "--parsable",
            f"--job-name={self.job_name}",
            f"--chdir={self.cwd}",
            # both runs of a requeued allocation in one file
            f"--output={self.sweep_dir}/slurm-%A_%a.out",
            "--open-mode=append",
            "--requeue",
        ]
        if o.allocations > 1:
            args.append(f"--array=0-{o.allocations - 1}")
        if o.gpus_per_allocation:
            args.append(f"--gres=gpu:{o.gpus_per_allocation}")
        if o.cpus_per_allocation:
            args.append(f"--cpus-per-task={o.cpus_per_allocation}")
        if o.time:
            args.append(f"--time={o.time}")
        if o.partition:
            args.append(f"--partition={o.partition}")
        if o.signal_s:
            args.append(f"--signal=B:USR1@{o.signal_s}")
        return [*args, *o.sbatch_args, str(script)]


def submit(submission: Submission) -> str:
    """Write the script into the sweep dir and ``sbatch`` it; the Slurm job id.

    Raises:
        FurcateConfigError: sbatch is missing or refused the job (its message, and the options
            that made the command).
    """
    submission.sweep_dir.mkdir(parents=True, exist_ok=True)
    script = submission.sweep_dir / SCRIPT
    # the user's alone: it exports the store's URL, whose password other users must not read
    atomic_write_bytes(script, submission.script().encode(), durable=False, mode=0o700)
    args = submission.sbatch_args(script)
    try:
        done = subprocess.run(
            ["sbatch", *args], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError as exc:
        raise FurcateConfigError(
            "hydra.launcher.backend",
            "slurm",
            f"sbatch could not run ({exc})",
            "run the sweep on a machine where Slurm's sbatch is on PATH (a login node), or "
            "set hydra.launcher.backend=local",
        ) from None
    if done.returncode != 0:
        raise FurcateConfigError(
            KEY,
            " ".join(shlex.quote(a) for a in args),
            f"sbatch refused the job: {(done.stderr or done.stdout).strip()}",
            f"change the {KEY} options (allocations, gpus_per_allocation, cpus_per_allocation, "
            "time, partition, sbatch_args) to what the cluster allows",
        )
    return done.stdout.strip().split(";")[0]


@dataclass(frozen=True)
class ArrayState:
    """The tasks of a submitted job, by state (``PENDING``, ``RUNNING``, ``COMPLETED``...)."""

    states: dict[str, str]

    @property
    def over(self) -> bool:
        return bool(self.states) and all(s in _OVER for s in self.states.values())

    @property
    def failed(self) -> list[str]:
        return sorted(t for t, s in self.states.items() if s in _OVER and s != "COMPLETED")

    def line(self) -> str:
        counts: dict[str, int] = {}
        for state in self.states.values():
            counts[state] = counts.get(state, 0) + 1
        return ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no task"


def array_state(job_id: str) -> ArrayState:
    """Each task's state, as ``scontrol`` tells it (finished ones for MinJobAge after)."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ArrayState({})
    states: dict[str, str] = {}
    for line in done.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        task = fields.get("ArrayTaskId")
        name = f"{job_id}_{task}" if task else fields.get("JobId", job_id)
        if "JobState" in fields:
            states[name] = fields["JobState"]
    return ArrayState(states)


def follow(
    job_id: str,
    poll_s: float,
    on_change: Callable[[ArrayState], None],
    state_of: Callable[[str], ArrayState] = array_state,
    sleep: Callable[[float], None] = time.sleep,
) -> ArrayState:
    """Until every task of ``job_id`` is over; ``on_change`` is told each new state."""
    last: ArrayState | None = None
    while True:
        state = state_of(job_id)
        if state != last:
            on_change(state)
            last = state
        if state.over:
            return state
        sleep(poll_s)


def command_of(argv: Sequence[str], python: str, drop: Sequence[str]) -> tuple[str, ...]:
    """The app's command line again, to run in each allocation: its script made absolute,
    overrides of the keys in ``drop`` left out (the allocation's own come after)."""
    script = str(Path(argv[0]).resolve()) if argv and argv[0].endswith(".py") else argv[0]
    kept = [a for a in argv[1:] if not any(a.lstrip("+~").startswith(f"{k}=") for k in drop)]
    return (python, script, *kept)
