"""furcate-hydra: run Hydra multirun sweeps of Lightning models on a pool of GPU slots.

The layers, each a subpackage (ARCHITECTURE.md draws them): ``execution`` runs jobs (slots,
the local fork-server pool), ``store`` remembers them in MLflow, ``sweeping`` and ``tuning``
decide what to run, ``lightning`` is the job's side, and ``hydra_layer`` is the only place
besides ``hydra_plugins/`` that imports Hydra. Importing this package stays cheap: a fork
server that is a new interpreter imports ``furcate_hydra.execution.forkserver.server`` and must
not pay for anything it does not use.
"""

from __future__ import annotations

__version__ = "0.1.0"
