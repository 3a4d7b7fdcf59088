"""Live edits (furcate's live updates): notice edits of the primary config file, reload it.

The reload is Hydra's own composition of the primary config with the sweep's command line,
so an edit reads exactly as if the sweep had been started with the new file, and an edit
Hydra cannot compose is an error here rather than a half-applied change.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf

from furcate_hydra.hydra_api.command_line import given_overrides
from furcate_hydra.sweeping.file_watch import FileWatcher

__all__ = ["LiveConfig", "primary_config_file"]

log = logging.getLogger(__name__)


def primary_config_file(config: DictConfig) -> Path | None:
    """The YAML file of the app's primary config, if it is a file on disk."""
    name = OmegaConf.select(config, "hydra.job.config_name")
    if not name:
        return None
    sources = OmegaConf.select(config, "hydra.runtime.config_sources") or []
    for source in sources:
        if source.get("provider") != "main" or source.get("schema") != "file":
            continue
        base = Path(str(source.get("path")))
        for candidate in (base / f"{name}.yaml", base / str(name)):
            if candidate.is_file():
                return candidate
    return None


class LiveConfig:
    """``changed()`` once per edit of the file; ``reload()`` composes the config as it is now."""

    def __init__(self, hydra_context: HydraContext, config: DictConfig, path: Path) -> None:
        self.path = path
        self._loader = hydra_context.config_loader
        self._config_name = str(config.hydra.job.config_name)
        # As typed: ${hydra.job.num} and the like are the job's to resolve, not ours.
        self._overrides = [*given_overrides(config, "hydra"), *given_overrides(config, "task")]
        self._watcher = FileWatcher(path)
        self._task = _task_part(config)

    def changed(self) -> bool:
        return self._watcher.changed()

    def reload(self) -> DictConfig:
        """Raises what Hydra raises for an edit it cannot compose (the edit is then ignored)."""
        return self._loader.load_configuration(
            config_name=self._config_name,
            overrides=list(self._overrides),
            run_mode=RunMode.MULTIRUN,
        )

    def task_values_changed(self, config: DictConfig) -> bool:
        """Whether the edit changed the task's own values too (not only hydra.*)."""
        task = _task_part(config)
        changed = task != self._task
        self._task = task
        return changed


def _task_part(config: DictConfig) -> dict[str, Any]:
    # Unresolved: comparing text is enough, and resolving could need the job's runtime.
    plain = OmegaConf.to_container(config, resolve=False)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return {str(k): v for k, v in plain.items()}
