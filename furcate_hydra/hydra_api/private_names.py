"""Hydra's private names that furcate uses, each read here and nowhere else.

Public first: a completed job's value is ``JobReturn.return_value``. What has no public way
is read below, and each name has a test (``tests/test_private_apis.py``) that fails, naming
it, when a Hydra release moves it:

    JobReturn._return_value   a failed job's exception: ``return_value`` raises it and
                              writes to stderr, where furcate only reads it
    ConfigLoaderImpl._apply_overrides_to_config,
    config_loader_impl.get_overrides_dirname
                              a job's config composed from its sweep's first (compose.py)
    hydra._internal.callbacks.Callbacks
                              the callbacks run_job calls, gated per job (job_context.py)
    hydra._internal.utils.get_args_parser
                              the app's command line read as Hydra reads it: the flags
                              that choose the primary config (command_line.py)
"""

from __future__ import annotations

from typing import Any

import hydra
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn
from omegaconf import DictConfig

from furcate_hydra.errors import PrivateApiMoved

# The Hydra releases these names were read from (pyproject pins hydra-core>=1.3.2,<1.4).
TESTED = "1.3.2 to 1.3.x"


class HydraPrivateMoved(PrivateApiMoved):
    """An Hydra release no longer has a private name furcate reads."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__("Hydra", "hydra-core", hydra.__version__, TESTED, name, problem)


try:
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
    from hydra._internal.utils import get_args_parser
except ImportError as exc:
    raise HydraPrivateMoved("hydra._internal", f"no longer has ({exc})") from None

__all__ = [
    "Callbacks",
    "HydraPrivateMoved",
    "apply_overrides",
    "get_args_parser",
    "get_overrides_dirname",
    "returned",
]


def returned(job_return: JobReturn) -> Any:
    """What the job's task returned, or the exception it raised; never raises."""
    try:
        return job_return._return_value
    except AttributeError:
        raise HydraPrivateMoved("JobReturn._return_value", "no longer has") from None


def apply_overrides(overrides: list[Override], config: DictConfig) -> None:
    """Apply parsed overrides to ``config`` as Hydra's config loader does."""
    apply = getattr(ConfigLoaderImpl, "_apply_overrides_to_config", None)
    if apply is None:
        raise HydraPrivateMoved("ConfigLoaderImpl._apply_overrides_to_config", "no longer has")
    apply(overrides, config)
