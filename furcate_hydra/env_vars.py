"""The environment a launcher gives each job: where it writes and which MLflow run it logs to.

The launcher sets these variables in the job's process; the Lightning layer reads them. Kept
apart from both so that neither side imports the other's heavy dependencies.
"""

from __future__ import annotations

__all__ = [
    "APP_CONFIG_FLAGS",
    "APP_MODULE",
    "APP_SCRIPT",
    "CHECKPOINT_DIR",
    "CHECKPOINT_EVERY_N_STEPS",
    "CHECKPOINT_EVERY_S",
    "EXPERIMENT_ID",
    "FUSE_DIR",
    "FUSE_KEY",
    "FUSE_LEFT",
    "FUSE_MAX",
    "FUSE_MIN_GAIN",
    "FUSE_SIZE",
    "FUSE_TIMEOUT_S",
    "FUSE_WIDTH_REPORT",
    "GPUS_PER_JOB",
    "LIGHTNING",
    "OPTUNA_MONITOR",
    "OPTUNA_PROXY_TLS_CERT",
    "OPTUNA_PROXY_TOKEN",
    "OPTUNA_PRUNER",
    "OPTUNA_PRUNE_TOKEN",
    "OPTUNA_PRUNE_URL",
    "OPTUNA_STORAGE",
    "OPTUNA_STUDY",
    "OPTUNA_TRIAL_NUMBER",
    "OUTPUT_DIR",
    "PROGRESS_EVERY_S",
    "PRUNED_AT_EPOCH_ATTR",
    "RESUMED_OUTPUT_DIR",
    "RUN_ID",
    "TRACKING_URI",
]

TRACKING_URI = "MLFLOW_TRACKING_URI"
RUN_ID = "MLFLOW_RUN_ID"
EXPERIMENT_ID = "MLFLOW_EXPERIMENT_ID"
OUTPUT_DIR = "FURCATE_OUTPUT_DIR"
# Stays the same when an interrupted run is launched again, so the job finds its checkpoints.
CHECKPOINT_DIR = "FURCATE_CHECKPOINT_DIR"
# A resumed run's previous job dir, where the app's own checkpoints of that attempt are.
RESUMED_OUTPUT_DIR = "FURCATE_RESUMED_OUTPUT_DIR"
# hydra.launcher.lightning: "auto" gives a Trainer the task builds what fit gives; "off" not
LIGHTNING = "FURCATE_LIGHTNING"
# hydra.launcher.checkpoint_every_n_steps / checkpoint_every_s: mid-epoch checkpoints that fit
# takes besides the epoch ones (absent: none of that kind)
CHECKPOINT_EVERY_N_STEPS = "FURCATE_CHECKPOINT_EVERY_N_STEPS"
CHECKPOINT_EVERY_S = "FURCATE_CHECKPOINT_EVERY_S"
# least seconds between two writes of progress.json mid-epoch (absent: 5); under
# jobs_per_gpu=auto the launcher asks for 1 s, as it measures steps/s from them
PROGRESS_EVERY_S = "FURCATE_PROGRESS_EVERY_S"

# How many GPUs the job's slot has (hydra.launcher.gpus_per_job; 0 on a CPU slot), set with
# its CUDA_VISIBLE_DEVICES: a Trainer asking for more devices is told so in furcate's words
GPUS_PER_JOB = "FURCATE_GPUS_PER_JOB"
# How the app was started, as its launcher saw it: the script's path, or the module of
# `python -m` (a job's process may be a fork server's own interpreter); Lightning's DDP
# launcher starts the job's other ranks the same way
APP_SCRIPT = "FURCATE_APP_SCRIPT"
APP_MODULE = "FURCATE_APP_MODULE"
# and the Hydra flags it was started with that choose the primary config (-cp, -cn, -cd), as
# a JSON list of "--config-<what>=<value>" (absent: none), which the ranks are given too
APP_CONFIG_FLAGS = "FURCATE_APP_CONFIG_FLAGS"

# Set by the Optuna sweeper in each trial's job (all four or none): the job reports its
# monitored metric each epoch to trial TRIAL_NUMBER of STUDY in STORAGE.
OPTUNA_STORAGE = "FURCATE_OPTUNA_STORAGE"
OPTUNA_STUDY = "FURCATE_OPTUNA_STUDY"
OPTUNA_TRIAL_NUMBER = "FURCATE_OPTUNA_TRIAL_NUMBER"
OPTUNA_MONITOR = "FURCATE_OPTUNA_MONITOR"
# optional: the study's pruner as JSON ({"name": "median", ...}); the storage does not keep it
OPTUNA_PRUNER = "FURCATE_OPTUNA_PRUNER"
# optional: where the sweeper decides for jobs on its machine (tuning/prune_service.py); the
# job reports there instead of to STORAGE, which it uses only if that does not answer
OPTUNA_PRUNE_URL = "FURCATE_OPTUNA_PRUNE_URL"
# set with PRUNE_URL: the trial's token, sent with each report (a secret: never logged); the
# service takes a report for this trial with it alone
OPTUNA_PRUNE_TOKEN = "FURCATE_OPTUNA_PRUNE_TOKEN"
# set with a grpc:// STORAGE (the sweeper's study proxy): the sweep's token, sent with every
# call (a secret: never logged), and, where the proxy uses TLS, its certificate's PEM text,
# the one the job trusts (public, so that no node needs the file)
OPTUNA_PROXY_TOKEN = "FURCATE_OPTUNA_PROXY_TOKEN"
OPTUNA_PROXY_TLS_CERT = "FURCATE_OPTUNA_PROXY_TLS_CERT"
# trial system attribute set when the job is pruned (by it, or by the sweeper's prune
# service for it); the sweeper then tells the trial PRUNED
PRUNED_AT_EPOCH_ATTR = "furcate:pruned_at_epoch"

# hydra.launcher.fuse=auto: the jobs started together for one fused group (absent: the job is
# not one). Their directory, where the first to reach fit leads; how many were started; the
# job's key there; the most members a group trains; how long the leader waits for them.
FUSE_DIR = "FURCATE_FUSE_DIR"
FUSE_SIZE = "FURCATE_FUSE_SIZE"
FUSE_KEY = "FURCATE_FUSE_KEY"
FUSE_MAX = "FURCATE_FUSE_MAX"
FUSE_TIMEOUT_S = "FURCATE_FUSE_TIMEOUT_S"
# fuse_max unset: the leader learns how many members train at once, each doubling kept while a
# member's share of a step falls by at least this fraction (hydra.launcher.auto_min_gain)
FUSE_MIN_GAIN = "FURCATE_FUSE_MIN_GAIN"
# the file the leader leaves in its group's directory with each group's learned width, for the
# launcher to size the groups it starts next (JSON: a list of {members, width, rising})
FUSE_WIDTH_REPORT = "width.json"
# the file the launcher leaves in a group's directory when a member's job ended (before its
# fit, it never joins: no leader waits for it), followed by the member's key
FUSE_LEFT = "left-"
