"""Running jobs: where they run (slots), what runs them (an ``Executor``), one ``Job`` per job.

``executor`` is the seam the launcher programs against; ``job_pool`` keeps it for every backend
over a ``transport``; ``local_pool`` is the transport of this machine, each job forked from a
warm server (``forkserver``). Imports no Hydra.
"""
