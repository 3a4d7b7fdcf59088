"""Where a sweep records, written into its sweep dir when it starts: ``furcate_sweep.json``.

    launcher, first batch ──► SweepPointer(store, experiment, sweep run) ──► furcate_sweep.json
    ``furcate status DIR`` ──► SweepPointer.read ──► the store and the sweep run to read

With it, anyone holding the sweep dir finds the sweep's runs, from any working directory and
while the sweep runs. A sweep dir that a later sweep reuses names that later sweep.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes

__all__ = ["SweepPointer", "SweepPointerError"]

_VERSION = 1


class SweepPointerError(ValueError):
    """``furcate_sweep.json`` is there but cannot be read as a sweep pointer."""


@dataclass(frozen=True)
class SweepPointer:
    """The sweep's store and run; ``tracking_uri`` is None when the sweep recorded no runs.

    Attributes:
        tracking_uri: The MLflow store (absolute), or None with ``mlflow.enabled=false``.
        experiment_id: The experiment the sweep's runs are in.
        experiment_name: Its name.
        sweep_run_id: The sweep's parent run; its job runs are its children.
        started_at: When the sweep started recording (seconds since the epoch).
        stale_after_s: The launcher's ``mlflow.stale_after_s``: how old its heartbeat may get
            before a reader on another machine counts the sweep as interrupted.
    """

    tracking_uri: str | None
    experiment_id: str | None
    experiment_name: str | None
    sweep_run_id: str | None
    started_at: float
    stale_after_s: float

    def write(self, path: Path) -> None:
        """Atomically: a reader never sees half a record."""
        data = {"version": _VERSION, **asdict(self)}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(data, indent=2).encode("utf-8"), durable=False)

    @classmethod
    def read(cls, path: Path) -> SweepPointer:
        """The record in ``path``; SweepPointerError when it is not one (OSError when absent)."""
        text = path.read_bytes()
        try:
            data = json.loads(text)
            return cls(
                tracking_uri=_optional_str(data["tracking_uri"]),
                experiment_id=_optional_str(data["experiment_id"]),
                experiment_name=_optional_str(data["experiment_name"]),
                sweep_run_id=_optional_str(data["sweep_run_id"]),
                started_at=float(data["started_at"]),
                stale_after_s=float(data["stale_after_s"]),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise SweepPointerError(f"{path} is not a furcate sweep record: {exc!r}") from None


def _optional_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"expected a string or null, got {value!r}")
