"""``hydra.launcher`` for furcate, validated once into typed options for the slots, pool and store.

Every key is read as given: ``with_defaults`` filled the ones a caller left out from the
launcher's config dataclass, the one place defaults live.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import ListConfig

from furcate_hydra import env_vars
from furcate_hydra.errors import FurcateConfigError, name_list, positive_seconds
from furcate_hydra.execution.fused_groups import LEARNED_SEATS
from furcate_hydra.execution.gpu.mps import check_mps_mode
from furcate_hydra.execution.pool_options import PoolOptions
from furcate_hydra.execution.slot_options import AUTO as AUTO_JOBS
from furcate_hydra.execution.slot_options import SlotOptions
from furcate_hydra.hydra_api.options import as_option_error, plain
from furcate_hydra.job_process.lightning_auto import AUTO, MODES, layer_for, server_imports
from furcate_hydra.monitor.views import PROGRESS_MODES
from furcate_hydra.ray_backend.options import Backend, RayOptions
from furcate_hydra.slurm.options import SlurmOptions
from furcate_hydra.store import CodeChange, Rerun

__all__ = ["LauncherOptions", "ProgressOptions", "StoreOptions", "TrainingOptions"]

FUSE_AUTO = "auto"
FUSE_MODES = (FUSE_AUTO, "off")
AUTO_WIDTH = "auto"  # fuse_max: learned, as unset
# Sampling a job's processes more often than this costs CPU and shows nothing more.
MIN_TRACE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class StoreOptions:
    """``hydra.launcher.mlflow`` with ``rerun`` and ``fingerprint_ignore``."""

    enabled: bool
    tracking_uri: str | None
    experiment_name: str | None
    heartbeat_s: float
    stale_after_s: float
    sqlite_wal: bool
    sqlite_index: bool
    rerun: Rerun
    code_change: CodeChange
    fingerprint_ignore: tuple[str, ...]

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> StoreOptions:
        mlflow = plain(options["mlflow"])
        ignore = name_list(
            "hydra.launcher.fingerprint_ignore",
            plain(options["fingerprint_ignore"]),
            "dotted config keys",
            "hydra.launcher.fingerprint_ignore=[data_dir,num_workers]",
        )
        return cls(
            enabled=bool(mlflow["enabled"]),
            tracking_uri=mlflow["tracking_uri"] or None,
            experiment_name=mlflow["experiment_name"] or None,
            heartbeat_s=_seconds(mlflow, "heartbeat_s", 10),
            stale_after_s=_seconds(mlflow, "stale_after_s", 60),
            sqlite_wal=bool(mlflow["sqlite_wal"]),
            sqlite_index=bool(mlflow["sqlite_index"]),
            rerun=Rerun.parse(options["rerun"]),
            code_change=CodeChange.parse(options["code_change"]),
            fingerprint_ignore=ignore,
        )


@dataclass(frozen=True)
class ProgressOptions:
    """How the sweep's progress is shown (``hydra.launcher.progress``, ``progress_every_s``)."""

    mode: str
    every_s: float

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> ProgressOptions:
        mode = options["progress"]
        if mode not in PROGRESS_MODES:
            raise FurcateConfigError(
                "hydra.launcher.progress",
                mode,
                f"must be one of {', '.join(PROGRESS_MODES)}",
                "set hydra.launcher.progress=auto (live on a terminal, plain lines otherwise), "
                "plain or off",
            )
        every = positive_seconds("hydra.launcher.progress_every_s", options["progress_every_s"], 30)
        return cls(mode, every)


@dataclass(frozen=True)
class TrainingOptions:
    """What a job's Lightning training gets: whether a Trainer the task builds itself gets what
    ``fit`` gives (``hydra.launcher.lightning``), and how often jobs checkpoint within an epoch
    (``hydra.launcher.checkpoint_every_n_steps``, ``checkpoint_every_s``)."""

    every_n_steps: int | None
    every_s: float | None
    lightning: str = AUTO

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> TrainingOptions:
        steps, seconds = options["checkpoint_every_n_steps"], options["checkpoint_every_s"]
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise FurcateConfigError(
                "hydra.launcher.checkpoint_every_n_steps",
                steps,
                "must be a whole number of optimizer steps, 1 or more",
                "set hydra.launcher.checkpoint_every_n_steps=500, or null to checkpoint at "
                "epoch ends only",
            )
        if seconds is not None:
            seconds = positive_seconds("hydra.launcher.checkpoint_every_s", seconds, 300)
        lightning = options["lightning"]
        if lightning not in MODES:
            raise FurcateConfigError(
                "hydra.launcher.lightning",
                lightning,
                f"must be one of {', '.join(MODES)}",
                "set hydra.launcher.lightning=auto (a Trainer the task builds gets resume, "
                "preemption, MLflow metrics, progress and pruning) or off (leave it alone)",
            )
        return cls(steps, seconds, lightning)

    def job_env(self) -> dict[str, str]:
        """The variables that tell a job (``JobEnv``, ``lightning_auto``) what it gets; unset
        cadences are left out."""
        env = {env_vars.LIGHTNING: self.lightning}
        if self.every_n_steps is not None:
            env[env_vars.CHECKPOINT_EVERY_N_STEPS] = str(self.every_n_steps)
        if self.every_s is not None:
            env[env_vars.CHECKPOINT_EVERY_S] = repr(self.every_s)
        return env


@dataclass(frozen=True)
class LauncherOptions:
    """Everything ``hydra.launcher`` says, checked before anything starts."""

    slots: SlotOptions
    pool: PoolOptions
    store: StoreOptions
    progress: ProgressOptions
    fail_fast: bool
    training: TrainingOptions
    # seconds between samples of each running job's resources; 0: no trace
    trace_interval_s: float
    # at exit: the sweep's stores closed, the interpreter's teardown left to the system
    fast_exit: bool
    backend: Backend = Backend.LOCAL
    ray: RayOptions = field(default_factory=RayOptions)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> LauncherOptions:
        """Raises OptionError naming the key, the value and the fix."""
        try:
            parsed = cls(
                _slot_options(options),
                _pool_options(options),
                StoreOptions.parse(options),
                ProgressOptions.parse(options),
                _flag(options, "fail_fast"),
                TrainingOptions.parse(options),
                _trace_interval(options["trace_interval_s"]),
                _flag(options, "fast_exit"),
                Backend.parse(options["backend"]),
                RayOptions.parse(plain(options["ray"])),
                SlurmOptions.parse(plain(options["slurm"])),
            )
            _check_local_only(parsed)
            _check_whole_gpus(parsed)
        except FurcateConfigError as exc:
            raise as_option_error(exc) from None
        return parsed


def _check_local_only(options: LauncherOptions) -> None:
    """What only the local backend does: ``jobs_per_gpu=auto`` reads this machine's GPUs and
    its jobs' processes, and ``mps=on`` starts a daemon on this machine."""
    if options.pool.mps == "on" and options.backend is not Backend.LOCAL:
        raise FurcateConfigError(
            "hydra.launcher.mps",
            "on",
            f"furcate starts MPS daemons on this machine only (backend=local), not on the "
            f"nodes of backend={options.backend.value}",
            "start nvidia-cuda-mps-control -d on each node yourself (its jobs use it), and set "
            "hydra.launcher.mps=auto or off",
        )
    if options.pool.fuse_max > 1 and options.backend is not Backend.LOCAL:
        raise FurcateConfigError(
            "hydra.launcher.fuse",
            FUSE_AUTO,
            f"fused groups start together on this machine's slots (backend=local), not on "
            f"the nodes of backend={options.backend.value}",
            "set hydra.launcher.fuse=off for this backend, or run the sweep with "
            "hydra.launcher.backend=local",
        )
    if not options.slots.auto:
        return
    if options.pool.fuse_max > 1:
        raise FurcateConfigError(
            "hydra.launcher.fuse",
            FUSE_AUTO,
            "with jobs_per_gpu=auto a GPU opens slots as each job's memory allows, and a fused "
            "group's jobs must start together",
            "set hydra.launcher.jobs_per_gpu to a number (1 is usual with fusion: one process "
            "trains the group), or hydra.launcher.fuse=off",
        )
    if options.backend is not Backend.LOCAL:
        raise FurcateConfigError(
            "hydra.launcher.jobs_per_gpu",
            AUTO_JOBS,
            f"auto needs backend=local (it reads each job's GPU memory on this machine), not "
            f"backend={options.backend.value}",
            "set hydra.launcher.jobs_per_gpu to a number of jobs per GPU, or "
            "gpu_mem_per_job_gb with ray.gpu_memory_gb",
        )


def _check_whole_gpus(options: LauncherOptions) -> None:
    """Jobs of several GPUs share none, and MPS serves only GPUs that jobs share."""
    n = options.slots.gpus_per_job
    if n > 1 and options.pool.mps == "on":
        raise FurcateConfigError(
            "hydra.launcher.mps",
            "on",
            f"with hydra.launcher.gpus_per_job={n} each job has its GPUs to itself, and MPS "
            "only lets jobs that share a GPU run their kernels at once",
            "set hydra.launcher.mps=auto (it starts no daemon for such a sweep) or off",
        )


def _slot_options(options: Mapping[str, Any]) -> SlotOptions:
    gpus = options["gpus"]
    if isinstance(gpus, ListConfig | tuple):
        gpus = list(gpus)  # SlotOptions validates the entries and says what is wrong
    return SlotOptions(
        gpus=gpus,
        jobs_per_gpu=options["jobs_per_gpu"],
        gpu_mem_per_job_gb=options["gpu_mem_per_job_gb"],
        max_jobs_per_gpu=options["max_jobs_per_gpu"],
        max_workers=options["max_workers"],
        cpus_per_job=options["cpus_per_job"],
        allow_cpu=options["allow_cpu"],
        gpu_mem_margin_gb=options["gpu_mem_margin_gb"],
        auto_min_gain=options["auto_min_gain"],
        gpus_per_job=options["gpus_per_job"],
    )


def _pool_options(options: Mapping[str, Any]) -> PoolOptions:
    max_retries = options["max_retries"]
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise FurcateConfigError(
            "hydra.launcher.max_retries",
            max_retries,
            "must be a whole number of retries, 0 or more",
            "set hydra.launcher.max_retries=0 (no retries) or a positive count such as 2",
        )
    max_preemptions = options["max_preemptions"]
    if (
        isinstance(max_preemptions, bool)
        or not isinstance(max_preemptions, int)
        or max_preemptions < 0
    ):
        raise FurcateConfigError(
            "hydra.launcher.max_preemptions",
            max_preemptions,
            "must be a whole number of times a job is queued again, 0 or more",
            "set hydra.launcher.max_preemptions=3, or 0 to end a preempted job's part in "
            "the sweep (its run stays resumable)",
        )
    preload = None
    if options["preload"] is not None:  # unset: what the launcher's process has loaded
        preload = name_list(
            "hydra.launcher.preload",
            plain(options["preload"]),
            "module names",
            "hydra.launcher.preload=[torch,pytorch_lightning], or leave it unset",
        )
    fuse_max, fuse_min_gain = _fuse_width(options)
    return PoolOptions(
        max_retries=max_retries,
        max_preemptions=max_preemptions,
        preload=preload,
        echo_output=bool(options["echo_output"]),
        stop_grace_s=positive_seconds("hydra.launcher.stop_grace_s", options["stop_grace_s"], 5),
        # (the local pool forks none ahead on a shared GPU either: see LocalTransport)
        # a fused group starts when seats for all of it are free: none is forked ahead
        fork_ahead=not _flag(options, "fail_fast") and fuse_max == 1,
        job_imports=server_imports(options["lightning"], preload),
        lightning_layer=layer_for(options["lightning"]),
        mps=check_mps_mode(options["mps"]),
        fuse_max=fuse_max,
        fuse_min_gain=fuse_min_gain,
    )


def _fuse_width(options: Mapping[str, Any]) -> tuple[int, float | None]:
    """A slot's seats for a fused group's jobs (1 with ``fuse=off``), and the least gain a
    learned width asks of each doubling (None: ``fuse_max`` is set, groups are that wide)."""
    fuse = options["fuse"]
    if fuse not in FUSE_MODES:
        raise FurcateConfigError(
            "hydra.launcher.fuse",
            fuse,
            f"must be one of {', '.join(FUSE_MODES)}",
            "set hydra.launcher.fuse=auto (configs whose models can train together do, in one "
            "process; the rest run one process each, with the reason) or off",
        )
    most = options["fuse_max"]
    if most is None or most == AUTO_WIDTH:
        if fuse != FUSE_AUTO:
            return 1, None
        return LEARNED_SEATS, float(options["auto_min_gain"])
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise FurcateConfigError(
            "hydra.launcher.fuse_max",
            most,
            "must be a whole number of configs trained together, 1 or more, or auto",
            "set hydra.launcher.fuse_max=32, or leave it unset (auto: as many as the memory "
            "free and the measured step times reward), or hydra.launcher.fuse=off",
        )
    return (most, None) if fuse == FUSE_AUTO else (1, None)


def _seconds(mlflow: Mapping[str, Any], key: str, example: float) -> float:
    return positive_seconds(f"hydra.launcher.mlflow.{key}", mlflow[key], example)


def _trace_interval(value: Any) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or (value != 0 and value < MIN_TRACE_INTERVAL_S):
        raise FurcateConfigError(
            "hydra.launcher.trace_interval_s",
            value,
            f"must be 0 (no resource trace) or a number of seconds of at least "
            f"{MIN_TRACE_INTERVAL_S:g} between samples",
            "set e.g. hydra.launcher.trace_interval_s=10, or =0 to trace nothing",
        )
    return float(value)


def _flag(options: Mapping[str, Any], key: str) -> bool:
    value = options[key]
    if not isinstance(value, bool):
        raise FurcateConfigError(
            f"hydra.launcher.{key}",
            value,
            "must be true or false",
            f"set hydra.launcher.{key}=true",
        )
    return value
