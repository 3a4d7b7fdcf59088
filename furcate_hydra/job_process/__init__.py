"""What runs in a job's own process, before and around the app's task: Hydra's ``run_job``
as the fork server holds it warm and each forked job runs it (``job_context``), the command
line of the ranks Lightning's DDP launcher starts (``rank_processes``), and
``hydra.launcher.lightning=auto`` (``lightning_auto``). The app itself then calls the public
library, ``furcate_hydra.lightning``."""
