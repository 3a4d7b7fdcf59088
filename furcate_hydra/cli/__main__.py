"""``python -m furcate_hydra.cli``: the ``furcate`` command without its console script."""

from __future__ import annotations

import sys

from furcate_hydra.cli.main import main

sys.exit(main())
