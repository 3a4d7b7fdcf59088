"""How the launcher's process (and the ``furcate`` command's) ends: what must end cleanly is
closed first, and the rest of its heap is left to the operating system instead of being taken
apart object by object.

After a sweep, the user's ``python train.py -m ...`` holds torch's, Lightning's and MLflow's
modules, millions of objects. At its exit CPython clears every module and runs full garbage
collections over all of them: ~2 s on a small machine, after the last job is done (see the
exit figures in BENCHMARKS.md). Python does not promise to finalize the objects still alive
at exit, so nothing may rely on that teardown; what needs an ending gets it explicitly here
(the sweep's end recorded, its database connections closed: closing the last sqlite
connection folds its WAL file into the store), and then ``gc.freeze`` moves every object out
of the collector's reach, so that its last collections have nothing to walk. Exit handlers
and ``weakref.finalize`` callbacks still run, and what the teardown frees by reference count
(an open file, mostly) is still closed; only objects in reference cycles go unfinalized.

Stdlib only: the launcher, the ``furcate`` command and the tuning layer register what they
opened.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import weakref
from collections.abc import Callable
from types import MethodType

__all__ = ["close_at_exit", "end_quickly"]

log = logging.getLogger(__name__)

# what runs at exit before the freeze, in order; a bound method is held by a weak reference
# (its object gone: nothing left to close)
_closers: dict[Callable[[], object], Callable[[], Callable[[], object] | None]] = {}
_ending_quickly_in: int | None = None  # the pid that asked; a fork inherits the handler


def close_at_exit(closer: Callable[[], object]) -> None:
    """Call ``closer`` at exit, before the heap is frozen, if this process ends quickly.

    Closers run in the order they were registered; registering one again moves it last, so
    that what closes a store can follow everything registered that still writes to it.
    """
    if isinstance(closer, MethodType):
        weak = weakref.WeakMethod(closer)
        key: Callable[[], object] = weak
        resolve: Callable[[], Callable[[], object] | None] = weak
    else:
        key = closer
        resolve = lambda: closer  # noqa: E731 (a resolver like WeakMethod's)
    for gone in [k for k, live in _closers.items() if live() is None]:
        del _closers[gone]
    _closers.pop(key, None)
    _closers[key] = resolve


def end_quickly() -> None:
    """From now on this process ends quickly (see the module doc); idempotent.

    Registered as early as the launcher can: exit handlers run last-registered first, so
    those of libraries loaded later (MLflow's, Ray's) still run before the freeze."""
    global _ending_quickly_in
    if _ending_quickly_in == os.getpid():
        return
    _ending_quickly_in = os.getpid()
    atexit.register(_at_exit)


def _at_exit() -> None:
    if _ending_quickly_in != os.getpid():  # a fork that exits normally: not its parent's end
        return
    for resolve in list(_closers.values()):
        closer = resolve()
        if closer is None:
            continue
        try:
            closer()
        except Exception as exc:  # one failing closer must not keep the others from running
            log.warning("at exit, %r failed: %s", closer, exc)
    gc.freeze()
