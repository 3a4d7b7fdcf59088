"""``hydra/launcher=furcate``: the options users set, registered in Hydra's ConfigStore."""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations, and OmegaConf reads the
# typing forms (Optional, List) to validate what users type.
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class MlflowConf:
    # record every job as an MLflow run (the memory behind skip and resume)
    enabled: bool = True
    # unset: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory
    tracking_uri: Optional[str] = None
    # unset: the task's name (hydra.job.name)
    experiment_name: Optional[str] = None
    # seconds between the launcher's heartbeats on the sweep's run
    heartbeat_s: float = 10.0
    # a RUNNING run whose launcher (on another machine) sent no heartbeat for this long
    # was interrupted; on the same machine a dead launcher pid tells at once
    stale_after_s: float = 60.0
    # switch a sqlite store to WAL journaling (faster concurrent writes; local disks only)
    sqlite_wal: bool = True
    # give a sqlite store furcate's index on its tags (key, value) when it lacks it, so
    # the skip and claim checks stay fast as the store grows (`furcate index --drop` undoes it)
    sqlite_index: bool = True


@dataclass
class RayConf:
    # the cluster: auto (the one this machine belongs to), HOST:PORT of its head, or
    # ray://HOST:PORT; unset: start a Ray instance on this machine (its usage stats off,
    # unless RAY_USAGE_STATS_ENABLED=1 is in the environment)
    address: Optional[str] = None
    # Ray namespace the slot actors live in (unset: an anonymous one)
    namespace: Optional[str] = None
    # Ray's runtime_env for the slot actors (working_dir, pip, env_vars, ...); Any, not a
    # Dict, so that `ray.runtime_env={env_vars:{A:b}}` replaces it instead of meeting struct mode
    runtime_env: Optional[Any] = None
    # memory of one of the cluster's GPUs, for gpu_mem_per_job_gb (Ray does not report it)
    gpu_memory_gb: Optional[float] = None
    # seconds the slot actors (each importing preload once) may take to start
    start_timeout_s: float = 600.0


@dataclass
class SlurmConf:
    # inside a Slurm job: when SIGUSR1 comes (sbatch --signal=B:USR1@<s>), every job saves a
    # checkpoint and the launcher requeues its Slurm job (scontrol requeue) before it exits;
    # null: if the job is requeueable (Slurm's Requeue=1), false: never
    requeue: Optional[bool] = None
    # backend=slurm: the allocations submitted (a job array of this size), each a pool of
    # slots pulling the sweep's configs from the store; a whole number, 1 or more
    allocations: Any = 1
    # backend=slurm: GPUs of each allocation (sbatch --gres=gpu:N); unset: none asked for
    gpus_per_allocation: Optional[Any] = None
    # backend=slurm: CPUs of each allocation (sbatch --cpus-per-task); unset: Slurm's default
    cpus_per_allocation: Optional[Any] = None
    # backend=slurm: each allocation's time limit (sbatch --time, e.g. 04:00:00); unset: the
    # partition's default
    time: Optional[Any] = None
    # backend=slurm: the partition (sbatch --partition); unset: the cluster's default
    partition: Optional[str] = None
    # backend=slurm: seconds before the time limit that the launcher gets SIGUSR1 to save and
    # requeue (sbatch --signal=B:USR1@<s>); 0: no signal (a whole number)
    signal_s: Any = 120
    # backend=slurm: more sbatch options, as sbatch takes them (--account=..., --qos=...)
    sbatch_args: List[str] = field(default_factory=list)
    # backend=slurm: shell lines each allocation runs before the sweep (module load ...,
    # source .venv/bin/activate)
    setup: List[str] = field(default_factory=list)
    # backend=slurm: follow the sweep until every allocation ended (false: return once
    # submitted; `furcate status` follows it from anywhere)
    wait: bool = False
    # backend=slurm with wait: seconds between looks at the queue and the sweep
    poll_s: float = 10.0


@dataclass
class FurcateLauncherConf:
    _target_: str = "hydra_plugins.furcate_launcher.furcate_launcher.FurcateLauncher"
    # where jobs run: local (this machine's GPUs, or a Slurm allocation's), ray (a Ray
    # cluster's, see `ray`) or slurm (allocations submitted with sbatch, see `slurm`)
    backend: str = "local"
    # the Ray cluster, with backend=ray
    ray: RayConf = field(default_factory=RayConf)
    # Slurm: requeue when the time limit nears; with backend=slurm, what is submitted
    slurm: SlurmConf = field(default_factory=SlurmConf)
    # GPU ids (CUDA_VISIBLE_DEVICES values) to use; unset: CUDA_VISIBLE_DEVICES, else NVML
    gpus: Optional[Any] = None
    # jobs sharing one GPU at a time (default 1), or auto: start at 1 (or at
    # gpu_mem_per_job_gb's count) and open one more slot at a time while the jobs' measured
    # peak GPU memory fits and the last job added raised the GPU's training rate by
    # auto_min_gain; under any count a job that runs out of GPU memory beside others is
    # queued again and its GPU runs one fewer; a number is exclusive with gpu_mem_per_job_gb
    # (typed Any so that `auto` and a bad value get furcate's message)
    jobs_per_gpu: Optional[Any] = None
    # GPUs of one machine each job gets to itself (its Trainer's devices): each slot is that
    # many GPUs, listed in CUDA_VISIBLE_DEVICES in the GPUs' order; GPUs left over stay unused;
    # above 1, no GPU is shared (not with jobs_per_gpu, gpu_mem_per_job_gb or mps=on); on CPU
    # slots it is left aside (typed Any so that a bad value gets furcate's message)
    gpus_per_job: Any = 1
    # size slots by memory: jobs per GPU = free GPU memory / this, at least 1
    gpu_mem_per_job_gb: Optional[float] = None
    # upper bound for jobs per GPU when sizing by memory or with jobs_per_gpu=auto; null: as
    # many as the cores can drive (at least one core each, cpus_per_job's where set)
    max_jobs_per_gpu: Optional[int] = None
    # with jobs_per_gpu=auto, the least fraction one more job must add to its GPU's aggregate
    # rate (training steps/s; GPU utilisation for jobs that report no progress) for the GPU
    # to keep it and try one more; 0: memory alone decides. With fuse=auto and fuse_max
    # unset, the least fraction by which each doubling of a fused group must cut a member's
    # share of a step
    auto_min_gain: Any = 0.05
    # with jobs_per_gpu=auto, GiB of each GPU kept free beyond its jobs' measured peaks: a new
    # job's CUDA context and its allocator's growth before they show in a sample
    gpu_mem_margin_gb: Any = 0.5
    # NVIDIA's MPS daemon, so that jobs sharing a GPU run their kernels at once instead of
    # taking turns: auto (start one where a GPU may run several jobs and MPS can run), on
    # (an error where it cannot) or off; a daemon you started is used and left alone (typed
    # Any: YAML reads a bare on/off as a boolean)
    mps: Any = "auto"
    # cap on the total number of slots (furcate's max_threads)
    max_workers: Optional[int] = None
    # cores pinned to each slot (per job: a job's ranks share them); torch/OpenMP threads
    # follow, split between the ranks of a job of several GPUs
    cpus_per_job: Optional[int] = None
    # with no GPU, run on CPU slots (false: stop with an error before anything runs)
    allow_cpu: bool = True
    # re-run a job whose process crashed (signal, os._exit) up to this many times
    max_retries: int = 0
    # queue a job again, into the same MLflow run, when it was preempted (SIGTERM or SIGUSR1
    # from outside the launcher: it saved a checkpoint and resumes from it), up to this many
    # times; a whole number, 0 or more (typed Any so that a bad value gets furcate's message)
    max_preemptions: Any = 3
    # a Lightning Trainer the task builds itself gets what furcate_hydra.lightning.fit gives
    # (resume, preemption, MLflow metrics, progress, pruning): auto; off leaves it alone
    lightning: str = "auto"
    # jobs training through fit or auto also checkpoint within an epoch after
    # this many optimizer steps (null: only at epoch ends; at most this many batches repeat
    # after a lost machine)
    checkpoint_every_n_steps: Optional[Any] = None
    # ... and after this many seconds: a lost machine costs a job at most this much training,
    # for ~0.7% of the training time of a 100 MB model with Adam (BENCHMARKS.md); null: off
    checkpoint_every_s: Optional[Any] = 300
    # fused trials: auto trains the configs whose models can train together (same module
    # class and shapes, same data and Trainer settings; hyperparameters may differ) as one
    # vmapped model in one process, each still its own run; the rest run one process each,
    # and the sweep says why in one line. off: one process per config (typed Any: YAML
    # reads a bare off as a boolean, which gets furcate's message)
    fuse: Any = "off"
    # the most configs trained together in one process (each slot runs groups of up to this
    # many jobs; a whole number, 1 or more). Unset (or auto): learned, as jobs_per_gpu=auto
    # is: each group's leader times its fused step at doubling widths on a sample batch and
    # trains as many at once as still pay by auto_min_gain per member and fit the memory
    # free; later groups start as wide as that (up to 128 per slot)
    fuse_max: Any = None
    # modules the warm fork server imports besides what the launcher's process has loaded
    # (the task's module and its imports: the server is a fork of it); unset: nothing more
    preload: Optional[List[str]] = None
    # copy each job's stdout/stderr to the console as well as to its log files
    echo_output: bool = True
    # the sweep's progress: auto (a live view on a terminal, plain status lines otherwise),
    # plain (status lines only), off
    progress: str = "auto"
    # seconds between plain status lines while jobs run
    progress_every_s: float = 30.0
    # at the first job that fails, start no more jobs (the running ones finish)
    fail_fast: bool = False
    # seconds a stopped job gets between SIGTERM and SIGKILL
    stop_grace_s: float = 5.0
    # seconds between samples of each job's memory, CPU and GPU use (its trace.csv, job/...
    # metrics in its run, peaks in run_data); 0 turns the trace off (typed Any so that a bad
    # value gets furcate's message)
    trace_interval_s: Any = 10.0
    # when the command ends, close the sweep's stores, then leave the interpreter's teardown
    # of torch's and MLflow's objects (~2 s) to the operating system; false: Python's usual
    # exit
    fast_exit: bool = True
    # the results store: every job a run, finished configs skipped, interrupted ones resumed
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    # which recorded configs run again: failed (FAILED and KILLED), all, none
    rerun: str = "failed"
    # a config FINISHED by other code (the tracked files but config files, or the task
    # module's hash): warn (skip it, say how many were), rerun (run it again), ignore
    code_change: str = "warn"
    # dotted config keys that do not change a job's result (data_dir, num_workers, ...)
    fingerprint_ignore: List[str] = field(default_factory=list)


ConfigStore.instance().store(
    group="hydra/launcher", name="furcate", node=FurcateLauncherConf, provider="furcate_launcher"
)
