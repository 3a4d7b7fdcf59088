"""A job's task config as plain values, resolved the way the job will see it.

Interpolations into the ``hydra`` node (``${hydra:runtime.output_dir}``, ``${hydra:job.num}``)
say where and as which job a config runs, not what it computes, and differ on every run; they
are kept as their text, so that the fingerprint of a config stays the same from one sweep to
the next. Any other interpolation is resolved; one that cannot be resolved here (it needs
the job's runtime) is kept as its text too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, Node, OmegaConf

__all__ = ["as_job", "task_container"]


@contextmanager
def as_job(sweep_config: DictConfig) -> Iterator[None]:
    """Let ``${hydra:...}`` read this job's config; the launcher's own view comes back after."""
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    # What set_config leaves readable, without its copy of the hydra node (~3 ms a job): the
    # hydra resolver reads cfg.hydra, whose parent is the job's whole config either way.
    hydra_config.cfg = sweep_config  # type: ignore[assignment]
    try:
        yield
    finally:
        hydra_config.cfg = previous


def task_container(sweep_config: DictConfig) -> dict[str, Any]:
    """The task config as plain values; call inside ``as_job(sweep_config)``."""
    return {str(k): _plain(sweep_config, k) for k in sweep_config if k != "hydra"}


def _plain(parent: DictConfig | ListConfig, key: Any) -> Any:
    node = parent._get_node(key)
    if OmegaConf.is_interpolation(parent, key):
        raw = str(node._value()) if isinstance(node, Node) else ""
        if "${hydra:" in raw:
            return raw
        try:
            value = parent[key]
        except Exception:
            return raw
        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
        return value
    if isinstance(node, DictConfig | ListConfig):
        if node._is_none():
            return None
        if node._is_missing():
            return "???"
        if isinstance(node, DictConfig):
            return {str(k): _plain(node, k) for k in node}
        return [_plain(node, i) for i in range(len(node))]
    if OmegaConf.is_missing(parent, key):
        return "???"
    return parent[key]
