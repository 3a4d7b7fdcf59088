"""The sweep's command-line overrides as typed, read in the launcher's process.

Hydra keeps them as strings in ``hydra.overrides.hydra`` and ``hydra.overrides.task``, and
OmegaConf reads a ``${...}`` in a string as an interpolation, so iterating those lists resolves
each override. In the launcher's process the job fields (``hydra.job.num``, ``hydra.job.id``,
``hydra.job.override_dirname``) are unset until Hydra composes each job, so resolving
``hydra.sweep.subdir=${hydra.job.num}`` there fails. The launcher and the sweepers only pass these
strings on (to Hydra's composition, to a run's tag), so they read them unresolved: whatever they
interpolate is resolved by the job, as Hydra's own sweepers leave it.
"""

from __future__ import annotations

from typing import Literal

from omegaconf import DictConfig, OmegaConf

__all__ = ["given_overrides"]


def given_overrides(config: DictConfig, part: Literal["hydra", "task"]) -> list[str]:
    """``hydra.overrides.<part>`` as the strings on the command line, nothing resolved."""
    node = OmegaConf.select(config, f"hydra.overrides.{part}", throw_on_missing=False)
    if node is None:
        return []
    values = OmegaConf.to_container(node, resolve=False)
    assert isinstance(values, list)
    return [str(value) for value in values]
