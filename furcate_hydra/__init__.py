"""furcate-hydra: run Hydra multirun sweeps of Lightning models on a pool of GPU slots.

The subpackages follow a job (ARCHITECTURE.md draws them): ``sweepers`` (what furcate's
sweepers share) ask ``launching`` (the launch session), whose ``scheduling`` decides what runs
when over ``records`` (skip / resume / record, on the MLflow ``store``) and an executor from
``execution`` (slots, the fork server; ``ray_backend``, ``slurm``); each job's process runs
``job_process`` and then the app, which calls ``lightning``. Hydra is imported only in
``hydra_api``, ``launching``, ``sweepers``, ``records``, ``job_process`` and ``hydra_plugins/``.
Importing this package stays cheap: a fork server that is a new interpreter imports
``furcate_hydra.execution.forkserver.entry`` and must not pay for anything it does not use.
"""

from __future__ import annotations

__version__ = "0.1.0"
