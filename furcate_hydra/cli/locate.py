"""Which sweep dir a command reads: the one given, else the newest under ``./multirun``."""

from __future__ import annotations

import os
from pathlib import Path

from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.sweep_record import SweepRecord, SweepRecordError

__all__ = ["MULTIRUN", "UsageError", "newest_sweep_dir", "sweep_dir_or_newest"]

# Hydra's default hydra.sweep.dir is multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}
MULTIRUN = Path("multirun")
_MAX_DEPTH = 3


class UsageError(Exception):
    """The command line cannot be used as given: what is wrong, and how to fix it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}.")


def sweep_dir_or_newest(given: str | None, root: Path = MULTIRUN) -> Path:
    return Path(given) if given else newest_sweep_dir(root)


def newest_sweep_dir(root: Path = MULTIRUN) -> Path:
    """The sweep dir under ``root`` that started last: one holding ``furcate_sweep.json`` (by
    the time it records) or, from a sweep without it, Hydra's ``multirun.yaml`` (by mtime)."""
    found: list[tuple[float, Path]] = []
    if root.is_dir():
        # links followed (a multirun dir of links to sweeps elsewhere); the depth is bounded
        for folder, dirs, files in os.walk(root, followlinks=True):
            depth = Path(folder).relative_to(root).parts
            if len(depth) >= _MAX_DEPTH:
                dirs[:] = []
            started = _started(Path(folder), files)
            if started is not None:
                found.append((started, Path(folder)))
                dirs[:] = []  # job dirs below a sweep dir are not sweeps
    if not found:
        raise UsageError(
            f"no SWEEP_DIR given, and no sweep dir under {root.absolute()} (the default: the "
            "newest sweep there)",
            "give the sweep dir (e.g. `furcate status multirun/2026-01-31/12-00-00`), or run "
            "furcate in the directory the sweep ran in",
        )
    return max(found)[1]


def _started(folder: Path, files: list[str]) -> float | None:
    paths = SweepPaths.of(folder)
    if SweepPaths.SWEEP_RECORD in files:
        try:
            return SweepRecord.read(paths.sweep_record).started_at
        except (OSError, SweepRecordError):
            pass
    if SweepPaths.MULTIRUN_YAML in files:
        try:
            return paths.multirun_yaml.stat().st_mtime
        except OSError:
            return None
    return None
