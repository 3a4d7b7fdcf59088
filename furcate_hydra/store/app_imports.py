"""What an app's jobs import, remembered in its experiment, so that its next sweep's fork server
imports it from the start (``hydra.launcher.preload`` unset).

One experiment tag, ``furcate.preload``: a JSON list of module names, in the order the server
imported them. Deleting the tag (or ``hydra.launcher.preload=[]`` for a sweep) forgets it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PRELOAD_TAG", "remember_imports", "remembered_imports"]

PRELOAD_TAG = "furcate.preload"

log = logging.getLogger(__name__)


def remembered_imports(tags: Mapping[str, str]) -> list[str]:
    """The modules an earlier sweep of this experiment's app learned, from the experiment's
    ``tags``; none if unreadable."""
    text = tags.get(PRELOAD_TAG)
    if not text:
        return []
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        log.warning(
            "furcate: the experiment's %s tag is not a list of module names (%r); "
            "nothing is preloaded from it, and this sweep writes it again",
            PRELOAD_TAG,
            text[:200],
        )
        return []
    return names


def remember_imports(
    client: Any, experiment_id: str, modules: Sequence[str], known: Sequence[str]
) -> None:
    """Remember ``modules`` (``known``: what the tag holds now) where they add to it."""
    names = [*known, *(m for m in modules if m not in known)]
    if names != list(known):
        client.set_experiment_tag(experiment_id, PRELOAD_TAG, json.dumps(names))
