"""What a job imported that its fork server had not: the installed packages it loaded itself.

A job is a fork of the server, so whatever the server has imported costs the job nothing. An app
that imports torch and Lightning inside its main function (to keep ``--help`` quick) has them
imported by every job instead, seconds each. Each job names, in its report, the top-level
packages it imported from an installed location (site-packages) in the order it imported them;
the launcher hands them to the server (``learned_imports``), and later jobs start warm.

The app's own modules (beside its script, or an editable checkout) are never named: importing
them in the server would run the app's code outside a job.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from collections.abc import Collection

__all__ = ["installed_imports"]


def installed_imports(before: Collection[str]) -> tuple[str, ...]:
    """Top-level packages in ``sys.modules`` now and not in ``before``, installed in a
    site-packages directory, in the order this process imported them."""
    dirs = _site_dirs()
    found = []
    for name, module in list(sys.modules.items()):  # dicts keep the order of import
        if "." in name or name.startswith("_") or name in before:
            continue
        where = _location(module)
        if where is not None and where.startswith(dirs):
            found.append(name)
    return tuple(found)


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    dirs.update(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _location(module: object) -> str | None:
    """Where a module was loaded from, resolved; None for built-in and frozen ones."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    if isinstance(origin, str) and os.path.isabs(origin):
        return os.path.realpath(origin)
    locations = list(getattr(spec, "submodule_search_locations", None) or ())
    return os.path.join(os.path.realpath(locations[0]), "") if locations else None
