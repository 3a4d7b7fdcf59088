"""furcate-hydra: run Hydra multirun sweeps of Lightning models on a pool of GPU slots.

The scheduling core (slots, pool, fork server) imports no Hydra; the Hydra plugins live under
``hydra_plugins/``. Importing this package stays cheap: the fork server is started with
``python -m furcate_hydra.forkserver.server`` and must not pay for anything it does not use.
"""

from __future__ import annotations

__version__ = "0.1.0"
