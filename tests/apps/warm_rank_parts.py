"""A module of the warm-rank app's own: the process that imported it (a DDP rank forked from its
job's process imports it again, as one started anew does)."""

from __future__ import annotations

import os

IMPORTED_IN = os.getpid()
