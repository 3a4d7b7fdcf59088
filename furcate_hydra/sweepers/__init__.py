"""What furcate's two sweepers share as Hydra plugins: the base class, the grid read from
Hydra, exclusion rules judged on composed configs, the JobReturns kept on disk, the door to
the Ray backend's storage checks. The Hydra-free rules and queue are in ``sweeping``."""
