"""Which sweep dir a command reads: the one given; else the newest under ``./multirun``; else
the newest sweep the working directory's store records whose dir is still there.

    SWEEP_DIR given ──► it
    none ──► ./multirun: the sweep dir that started last (Hydra's default hydra.sweep.dir)
         ──► none there: the store (--tracking-uri, MLFLOW_TRACKING_URI, ./mlflow.db), whose
             sweep runs name their dirs (an app may set hydra.sweep.dir anywhere)
         ──► none there: an error naming both places and the fix
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from furcate_hydra.layout import SweepPaths
from furcate_hydra.store.sweep_list import recorded_sweep_dirs
from furcate_hydra.store.sweep_pointer import SweepPointer, SweepPointerError
from furcate_hydra.store.tracking_uri import ENV_KEY, TrackingUri, resolve_tracking_uri

__all__ = [
    "MULTIRUN",
    "UsageError",
    "newest_recorded_sweep",
    "newest_sweep_dir",
    "sweep_dir_or_newest",
]

# Hydra's default hydra.sweep.dir is multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}
MULTIRUN = Path("multirun")
_MAX_DEPTH = 3


class UsageError(Exception):
    """The command line cannot be used as given: what is wrong, and how to fix it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}.")


def sweep_dir_or_newest(
    given: str | None, tracking_uri: str | None, note: TextIO, root: Path = MULTIRUN
) -> Path:
    """The sweep dir to read; without ``given``, says on ``note`` in one line which sweep was
    taken and where it was found.

    Raises:
        UsageError: Neither ``root`` nor the store has a sweep.
        FurcateConfigError: The store cannot be read.
    """
    if given:
        return Path(given)
    found = newest_sweep_dir(root)
    if found is not None:
        note.write(f"newest sweep under {root}/: {found}\n")
        return found
    store, origin = _store(tracking_uri)
    recorded, why_not = newest_recorded_sweep(store)
    if recorded is not None:
        note.write(f"newest sweep in {store.uri}: {_shown(recorded)}\n")
        return recorded
    raise UsageError(
        f"no SWEEP_DIR given, no sweep dir under {root.absolute()}, and no sweep in "
        f"{store.uri} ({origin}: {why_not})",
        "give the sweep dir (hydra.sweep.dir, e.g. multirun/2026-01-31/12-00-00), run furcate "
        "in the directory the sweep ran in, or give --tracking-uri of the store it recorded into",
    )


def newest_sweep_dir(root: Path = MULTIRUN) -> Path | None:
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
    return max(found)[1] if found else None


def newest_recorded_sweep(store: TrackingUri) -> tuple[Path | None, str]:
    """The newest sweep ``store`` records whose dir is still there; else None and why not."""
    path = store.sqlite_path
    if path is not None and not path.is_file():
        return None, "no such file"
    count = 0
    for recorded in recorded_sweep_dirs(store):
        count += 1
        if recorded and Path(recorded).is_dir():  # a deleted sweep dir leaves its runs behind
            return Path(recorded), ""
    if count == 0:
        return None, "it records none"
    if count == 1:
        return None, "the dir of its one sweep is gone"
    return None, f"the dirs of all {count} of its sweeps are gone"


def _store(tracking_uri: str | None) -> tuple[TrackingUri, str]:
    """The store to look in, and what chose it: ``--tracking-uri``, else the launcher's
    default (``MLFLOW_TRACKING_URI``, else ./mlflow.db); errors name the setting to change."""
    if tracking_uri:
        return TrackingUri(tracking_uri, "--tracking-uri"), "--tracking-uri"
    store = resolve_tracking_uri(None)
    if store.source == ENV_KEY:
        return store, ENV_KEY
    # the launcher's default names the launcher's option; here the one to give is ours
    return TrackingUri(store.uri, "--tracking-uri"), "the default store"


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when it is inside it: shorter to read."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _started(folder: Path, files: list[str]) -> float | None:
    paths = SweepPaths.of(folder)
    if SweepPaths.SWEEP_RECORD in files:
        try:
            return SweepPointer.read(paths.sweep_record).started_at
        except (OSError, SweepPointerError):
            pass
    if SweepPaths.MULTIRUN_YAML in files:
        try:
            return paths.multirun_yaml.stat().st_mtime
        except OSError:
            return None
    return None
