"""``hydra.launcher.slurm``: requeue inside a Slurm job, and what ``backend=slurm`` submits.

Pure: checked before anything starts, whether or not Slurm is installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from furcate_hydra.errors import FurcateConfigError, name_list, positive_seconds

__all__ = ["SlurmOptions"]

KEY = "hydra.launcher.slurm"
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME_RE = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")


@dataclass(frozen=True)
class SlurmOptions:
    """What ``hydra.launcher.slurm`` says; the defaults are the config dataclass's."""

    # inside a Slurm job, requeue it at SIGUSR1; None: if Slurm says it is requeueable
    requeue: bool | None = None
    # backend=slurm: how many allocations (a job array of this size) pull the sweep's configs
    allocations: int = 1
    gpus_per_allocation: int | None = None
    cpus_per_allocation: int | None = None
    time: str | None = None
    partition: str | None = None
    # seconds before the time limit that Slurm sends SIGUSR1 to the launcher (0: none)
    signal_s: int = 120
    sbatch_args: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    wait: bool = False
    poll_s: float = 10.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SlurmOptions:
        """Raises FurcateConfigError naming the key, the value and the fix."""
        requeue = options.get("requeue")
        if requeue is not None and not isinstance(requeue, bool):
            raise FurcateConfigError(
                f"{KEY}.requeue",
                requeue,
                "must be true, false or null",
                f"set {KEY}.requeue=null (requeue a requeueable Slurm job when its time runs "
                "out), true, or false (end the job then; rerun the command to resume)",
            )
        time = options.get("time")
        if time is not None and (
            not isinstance(time, str | int) or not _TIME_RE.fullmatch(str(time))
        ):
            raise FurcateConfigError(
                f"{KEY}.time",
                time,
                "is not a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS)",
                f"set e.g. {KEY}.time=04:00:00, or leave it unset for the partition's default",
            )
        partition = options.get("partition")
        if partition is not None and (not isinstance(partition, str) or not partition):
            raise FurcateConfigError(
                f"{KEY}.partition",
                partition,
                "must be a partition's name",
                f"set {KEY}.partition=gpu",
            )
        wait = options.get("wait", cls.wait)
        if not isinstance(wait, bool):
            raise FurcateConfigError(
                f"{KEY}.wait",
                wait,
                "must be true or false",
                f"set {KEY}.wait=true to follow the sweep until it ends, or false to return once "
                "submitted",
            )
        return cls(
            requeue=requeue,
            allocations=_whole(options, "allocations", cls.allocations, 1, "4"),
            gpus_per_allocation=_maybe_whole(options, "gpus_per_allocation", 0, "4"),
            cpus_per_allocation=_maybe_whole(options, "cpus_per_allocation", 1, "16"),
            time=None if time is None else str(time),
            partition=partition,
            signal_s=_whole(options, "signal_s", cls.signal_s, 0, "120"),
            sbatch_args=name_list(
                f"{KEY}.sbatch_args",
                _plain_list(options.get("sbatch_args")),
                "sbatch options",
                f"{KEY}.sbatch_args=[--account=myproject,--qos=normal]",
            ),
            setup=name_list(
                f"{KEY}.setup",
                _plain_list(options.get("setup")),
                "shell lines",
                f"{KEY}.setup=['module load cuda','source .venv/bin/activate']",
            ),
            wait=wait,
            poll_s=positive_seconds(f"{KEY}.poll_s", options.get("poll_s", cls.poll_s), 10),
        )


def _plain_list(value: Any) -> Any:
    if value is None:
        return []
    return (
        list(value)
        if not isinstance(value, str | bytes | Mapping) and hasattr(value, "__iter__")
        else value
    )


def _whole(options: Mapping[str, Any], name: str, default: int, least: int, example: str) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise FurcateConfigError(
            f"{KEY}.{name}",
            value,
            f"must be a whole number, {least} or more",
            f"set e.g. {KEY}.{name}={example}",
        )
    return value


def _maybe_whole(options: Mapping[str, Any], name: str, least: int, example: str) -> int | None:
    if options.get(name) is None:
        return None
    return _whole(options, name, 0, least, example)
