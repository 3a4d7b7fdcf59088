"""The sweep's command line as typed, read in the launcher's process: its overrides, and the
flags that choose the primary config.

Hydra keeps them as strings in ``hydra.overrides.hydra`` and ``hydra.overrides.task``, and
OmegaConf reads a ``${...}`` in a string as an interpolation, so iterating those lists resolves
each override. In the launcher's process the job fields (``hydra.job.num``, ``hydra.job.id``,
``hydra.job.override_dirname``) are unset until Hydra composes each job, so resolving
``hydra.sweep.subdir=${hydra.job.num}`` there fails. The launcher and the sweepers only pass these
strings on (to Hydra's composition, to a run's tag), so they read them unresolved: whatever they
interpolate is resolved by the job, as Hydra's own sweepers leave it.

The primary config's flags (``-cp``, ``-cn``, ``-cd``) are in no config node as given: they are
read from the app's arguments by Hydra's own parser, abbreviations and ``--flag=value`` alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NoReturn

from omegaconf import DictConfig, OmegaConf

from furcate_hydra.hydra_api.private_names import get_args_parser

__all__ = ["given_overrides", "primary_config_flags"]

# Hydra's flags that choose the primary config, by the names its parser gives their values
_PRIMARY_CONFIG = {
    "config_path": "--config-path",
    "config_name": "--config-name",
    "config_dir": "--config-dir",
}


def given_overrides(config: DictConfig, part: Literal["hydra", "task"]) -> list[str]:
    """``hydra.overrides.<part>`` as the strings on the command line, nothing resolved."""
    node = OmegaConf.select(config, f"hydra.overrides.{part}", throw_on_missing=False)
    if node is None:
        return []
    values = OmegaConf.to_container(node, resolve=False)
    assert isinstance(values, list)
    return [str(value) for value in values]


def primary_config_flags(argv: Sequence[str]) -> list[str]:
    """The flags among an app's arguments (``sys.argv[1:]``) that choose its primary config,
    each as ``--config-<what>=<value>``, their values as given; none of the rest (``-m``, the
    overrides). Arguments Hydra's parser refuses (the app was not started by ``hydra.main``)
    have none."""
    parser = get_args_parser()
    parser.error = _refuse  # type: ignore[method-assign]  # argparse's own ends the process
    try:
        args, _ = parser.parse_known_args(list(argv))
    except _Refused:
        return []
    values = {name: getattr(args, name, None) for name in _PRIMARY_CONFIG}
    return [
        f"{flag}={values[name]}"
        for name, flag in _PRIMARY_CONFIG.items()
        if values[name] is not None
    ]


class _Refused(Exception):
    pass


def _refuse(message: str) -> NoReturn:
    raise _Refused(message)
