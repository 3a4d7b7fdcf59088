"""Running jobs: where they run (slots), what runs them (an ``Executor``), one record per job.

``executor`` is the seam the launcher programs against; ``local_pool`` runs jobs on this
machine, each forked from a warm server (``forkserver``). Imports no Hydra.
"""
