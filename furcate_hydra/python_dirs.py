"""Where this interpreter's installed packages and standard library live: code that is not an
app's own (a job names what it imported from there; a DDP rank forgets what is not)."""

from __future__ import annotations

import functools
import os
import site
import sysconfig

__all__ = ["library_dirs"]


@functools.cache
def library_dirs(stdlib: bool) -> tuple[str, ...]:
    """The installed packages' dirs (site-packages, the user's too) and, with ``stdlib``, the
    standard library's: each as written and resolved, ending with a separator, for
    ``str.startswith``."""
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib") if stdlib else ("purelib", "platlib")
    dirs = [paths[key] for key in keys if key in paths]
    dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    found = {os.path.normpath(os.path.abspath(d)) for d in dirs if d}
    found |= {os.path.realpath(d) for d in found}
    return tuple(d.rstrip(os.sep) + os.sep for d in sorted(found))
