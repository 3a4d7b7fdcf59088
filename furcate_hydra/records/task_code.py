"""What a sweep's code version is taken from: the task's module, and the app's config dirs,
whose config files are left out (a job's fingerprint covers its composed config)."""

from __future__ import annotations

import importlib.resources
import inspect
from pathlib import Path

from hydra.types import TaskFunction
from omegaconf import DictConfig

from furcate_hydra.store import CodeVersion, code_version

__all__ = ["task_code_version"]


def task_code_version(task_function: TaskFunction, config: DictConfig) -> CodeVersion | None:
    """The code version of the sweep's task (see ``store/code_version.py``)."""
    return code_version(_module_file(task_function), _config_dirs(config))


def _module_file(task_function: TaskFunction) -> Path | None:
    """The file of the task's module."""
    function = inspect.unwrap(task_function)
    try:
        source = inspect.getsourcefile(function)
    except TypeError:  # a builtin or a callable object without a file
        source = None
    return Path(source) if source else None


def _config_dirs(config: DictConfig) -> list[Path]:
    """The folders Hydra composed the sweep's configs from (``hydra.runtime.config_sources``):
    the app's ``config_path``, ``--config-dir``, ``hydra.searchpath``; a package's as a folder.
    Hydra's own and the plugins' are among them, outside the app's work tree."""
    dirs = []
    for source in config.hydra.runtime.get("config_sources") or []:
        if source.schema == "file":
            dirs.append(Path(source.path))
        elif source.schema == "pkg":
            try:
                # as Hydra reads it; the package is imported already, to compose the config
                folder = importlib.resources.files(source.path)
            except (ImportError, TypeError, ValueError):
                continue
            if isinstance(folder, Path):  # not one inside a zip: no work tree holds it
                dirs.append(folder)
    return dirs
