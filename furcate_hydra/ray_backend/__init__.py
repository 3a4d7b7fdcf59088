"""The Ray backend: the same sweeps on a Ray cluster (``hydra.launcher.backend=ray``).

Modules here import Ray only inside functions, so this package loads without it; nothing
outside this package imports Ray.
"""
