"""Loaded by every Python process the tests start (conftest puts this folder on PYTHONPATH):
such a process skips the interpreter's last garbage collection when it exits.

That collection walks every object still alive, ~0.7 s of CPU in a process that imported torch
through Lightning (torch._dynamo's graph), and the suite starts hundreds of such processes (each
CLI run, each DDP rank) on two cores. Freezing the heap from the last exit handler leaves it
out; everything a test can observe still happens: the other exit handlers (registered later, so
run first: logging's flush, MLflow's, weakref finalizers), and the frees by reference count as
modules are torn down. Only unreachable cycles go uncollected, as after ``os._exit``, which is
how furcate's own job processes end anyway. Users' processes never load this file.

A ``sitecustomize`` this one shadows on ``sys.path`` is still run.
"""

from __future__ import annotations

import atexit
import gc
import importlib.machinery
import importlib.util
import os
import sys

atexit.register(gc.freeze)  # first registered: run last, right before the interpreter's own end


def _run_the_shadowed_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_the_shadowed_one()
