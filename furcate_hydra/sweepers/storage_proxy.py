"""Where a sweeper serves its Optuna storage to the launcher's Ray nodes: the sweeper's door
to the Ray backend's store checks.

A sweeper runs with any launcher, so it loads nothing of the executor nor of the Ray
backend: ``ray_backend.options`` is imported only once the launcher is furcate's with
``backend=ray``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.hydra_api.options import as_option_error

__all__ = ["sweeper_storage_proxy"]

# Backend.RAY's value, spelled here so that another launcher loads nothing of the Ray backend
_RAY = "ray"


def sweeper_storage_proxy(
    launcher: Mapping[str, Any] | None, key: str, uri: str, proxy: tuple[str, int] | None
) -> tuple[str, int] | None:
    """Where the sweeper serves its storage to the launcher's Ray nodes, or None: jobs open
    ``uri`` itself.

    ``launcher``: ``hydra.launcher`` as configured (another launcher than furcate's, or the
    local backend, needs nothing served). ``proxy``: ``hydra.sweeper.storage_proxy`` as
    (host, port), port 0 for any; unset, the address on the route to the cluster's head.

    Raises:
        OptionError: ``uri`` is a file the nodes cannot reach and cannot be served, or no
            address for the proxy is known.
    """
    if not launcher or launcher.get("backend") != _RAY:
        return None
    from furcate_hydra.ray_backend.options import (
        RayOptions,
        address_toward,
        check_store_reachable,
        served_by_proxy,
    )

    try:
        ray = RayOptions.parse(launcher.get("ray") or {})
        check_store_reachable(key, uri, ray)
        if not served_by_proxy(key, uri, ray):
            return None
        return proxy if proxy is not None else (address_toward(ray), 0)
    except FurcateConfigError as exc:
        raise as_option_error(exc) from None
