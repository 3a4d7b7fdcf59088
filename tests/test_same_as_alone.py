"""A differential suite: every config of a sweep ends under furcate as it ends with no furcate.

The app (``apps/differential_app.py``) is a Lightning app as users write it, its own Trainer
and all. One sweep of its matrix (a row per thing Lightning apps do, two configs a row) runs
through the real CLI four times:

    reference     Hydra's basic launcher: no furcate anywhere
    off           hydra/launcher=furcate hydra.launcher.fuse=off
    auto          hydra/launcher=furcate hydra.launcher.fuse=auto
    interrupted   fuse=auto, its whole process group killed (SIGKILL) once jobs are
                  mid-training, then the same command again: it resumes them
    preempted     fuse=off, its whole process group sent SIGTERM (a scheduler's preemption:
                  each job checkpoints where it is and stops) mid-training, then again

and each config (matched by its ``.hydra/overrides.yaml``) must end with the reference's
weights (``weights.pt``), CSVLogger rows (every column, every row of ``metrics.csv``), return
value (``result.json``) and the app's checkpoints (the files' names; ``last.ckpt``'s weights,
epoch, step, optimizer and scheduler states and hyperparameters). Bitwise, unless the config
trained fused: the members' vmapped step adds in another order, so its floats may differ by
``FUSED`` (measured below). Under fuse=auto every job says whether it trained fused or why
not (``furcate: not fused: <reason>``), and a row whose model cannot be fused says why.

"The same arithmetic" includes the thread count: each furcate job gets one core
(``cpus_per_job=1``) and the reference one thread, as on a machine with one core a job.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from furcate_hydra.layout import JobPaths
from tests.conftest import APPS, run_cli
from tests.process_helpers import killed_if_left, still_alive, wait_for

# five sweeps of 44 Lightning jobs: ~200 s on two cores, run once, in one worker, for all the
# module's tests; the first test sets up two sweeps (the reference and fuse=off)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("same-as-alone"),
    pytest.mark.timeout(900),
]

APP = APPS / "differential_app.py"
# the app's variable: while the file it names exists, each sample takes 10 ms more
SLOW_WHILE = "DIFFERENTIAL_APP_SLOW_WHILE"
ROWS = (
    "unshuffled",
    "shuffled",
    "own_generator",
    "datamodule",
    "workers",
    "val_every_2_epochs",
    "val_every_n_steps",
    "accumulate_clip",
    "step_scheduler",
    "epoch_scheduler",
    "plateau_val",
    "plateau_train",
    "early_stopping",
    "epoch_in_step",
    "child_hparam",
    "nested_hparam",
    "dropout",
    "batchnorm",
    "two_optimizers",
    "sgd_nesterov",
    "adamw_flags",
    "unpicklable",
)
VARIANTS = ("a", "b")
GRID = (f"row={','.join(ROWS)}", f"variant={','.join(VARIANTS)}")
# one core, one thread a job: furcate sizes a job's thread pools by its slot's cores, and the
# reference runs with as many, so that both add in the same order (BatchNorm's statistics
# reduce differently on 1 thread than on 2)
FURCATE = (
    "hydra/launcher=furcate",
    "hydra.launcher.max_workers=2",
    "hydra.launcher.cpus_per_job=1",
)
ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), "1")
RUNS = ("off", "auto", "interrupted", "preempted")
# rows whose model a vmapped step cannot train as its own run would (random numbers drawn in
# training, running statistics, optimizers stepped by hand, a module that cannot be copied):
# under fuse=auto each of their configs runs alone and says why
ALONE_ROWS = ("dropout", "batchnorm", "two_optimizers", "unpicklable")
FUSED_LINE = "furcate: fused: trained with"
ALONE_LINE = "furcate: not fused: "
# the interrupted sweep is killed once this many configs are mid-training, or some are and
# no more came for a while
MID_TRAINING = 8
MID_TRAINING_WAIT_S = 5.0

Config = tuple[str, str]  # (row, variant)


@dataclass(frozen=True)
class Tolerance:
    """How close a float of furcate's run must be to the reference's (0, 0: bitwise)."""

    rtol: float
    atol: float

    def close(self, got: float, want: float) -> bool:
        if self.rtol == self.atol == 0:
            return got == want or (math.isnan(got) and math.isnan(want))
        return math.isclose(got, want, rel_tol=self.rtol, abs_tol=self.atol)

    def tensors_close(self, got: torch.Tensor, want: torch.Tensor) -> bool:
        if got.shape != want.shape or got.dtype != want.dtype:
            return False
        if self.rtol == self.atol == 0 or not want.is_floating_point():
            return torch.equal(got, want)
        return torch.allclose(got, want, rtol=self.rtol, atol=self.atol, equal_nan=True)


EXACT = Tolerance(rtol=0.0, atol=0.0)
# a fused member's floats: its step runs vmapped over the group, which may add in another
# order. Measured on the rows furcate fuses right: weights bitwise equal, logged values at
# most 1.2e-7 apart (2.5e-7 relative: an epoch mean); a wrong one is 1e-3 apart or more
FUSED = Tolerance(rtol=1e-6, atol=1e-7)


# -- the sweeps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What a job dir held when the interrupted sweep was killed."""

    log_sizes: tuple[int, int]  # bytes of stdout.log and stderr.log then
    log: str
    checkpoint: bool  # furcate had kept a checkpoint of it
    finished: bool  # its run was recorded FINISHED

    @property
    def mid_training(self) -> bool:
        return self.checkpoint and not self.finished


@dataclass(frozen=True)
class Sweep:
    """One sweep of the whole matrix: each config's job dir, and what the command printed."""

    name: str
    dir: Path
    output: str
    returncode: int
    jobs: dict[Config, Path]
    at_kill: dict[Config, Attempt]  # the interrupted sweep's first command, when killed

    @classmethod
    def read(
        cls,
        name: str,
        sweep_dir: Path,
        done: subprocess.CompletedProcess[str],
        at_kill: dict[Config, Attempt] | None = None,
    ) -> Sweep:
        jobs = {config_of(job): job for job in job_dirs(sweep_dir)}
        output = done.stdout + done.stderr
        return cls(name, sweep_dir, output, done.returncode, jobs, at_kill or {})

    def job(self, config: Config) -> Path:
        assert config in self.jobs, f"{self.name}: no job dir of {config}:\n{self.output[-3000:]}"
        return self.jobs[config]

    def rerun_log(self, config: Config) -> str:
        """What the job printed in the command that ended the sweep (the rerun, if killed)."""
        job, before = self.job(config), self.at_kill.get(config)
        sizes = before.log_sizes if before else (0, 0)
        return "".join(
            (job / name).read_bytes()[size:].decode(errors="replace")
            for name, size in zip((JobPaths.STDOUT, JobPaths.STDERR), sizes, strict=True)
            if (job / name).is_file()
        )


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(path.parent.parent for path in sweep_dir.glob("*/.hydra/overrides.yaml"))


def config_of(job: Path) -> Config:
    """The job's (row, variant), from the overrides Hydra wrote for it."""
    lines = (job / ".hydra" / "overrides.yaml").read_text().splitlines()
    overrides = dict(line.removeprefix("- ").split("=", 1) for line in lines if line.strip())
    return overrides["row"], overrides["variant"]


def job_log(job: Path) -> str:
    return "".join(
        (job / name).read_text(errors="replace")
        for name in (JobPaths.STDOUT, JobPaths.STDERR)
        if (job / name).is_file()
    )


def store_env(work: Path, name: str, empty_store: Path) -> dict[str, str]:
    """The environment of a furcate sweep recording into an empty store of its own (else it
    would skip the configs another sweep recorded)."""
    shutil.copyfile(empty_store, work / f"{name}.db")
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / name}.db"}


def sweep_command(sweep_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, str(APP), "-m", f"hydra.sweep.dir={sweep_dir}", *GRID, *overrides]


def run_sweep(work: Path, name: str, *overrides: str, env: dict[str, str]) -> Sweep:
    command = sweep_command(work / name, *overrides)
    done = run_cli(Path(command[1]), *command[2:], cwd=work, env=env, timeout=900)
    return Sweep.read(name, work / name, done)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("same_as_alone")


@pytest.fixture(scope="module")
def reference(work: Path) -> Sweep:
    """Hydra's basic launcher: every job in this one process, one after the other."""
    sweep = run_sweep(work, "reference", env={**os.environ, **ONE_THREAD})
    assert sweep.returncode == 0, sweep.output[-5000:]
    assert len(sweep.jobs) == len(ROWS) * len(VARIANTS)
    return sweep


@pytest.fixture(scope="module")
def off(work: Path, empty_mlflow_db: Path) -> Sweep:
    env = store_env(work, "off", empty_mlflow_db)
    return run_sweep(work, "off", *FURCATE, "hydra.launcher.fuse=off", env=env)


@pytest.fixture(scope="module")
def auto(work: Path, empty_mlflow_db: Path) -> Sweep:
    env = store_env(work, "auto", empty_mlflow_db)
    return run_sweep(work, "auto", *FURCATE, "hydra.launcher.fuse=auto", env=env)


@pytest.fixture(scope="module")
def interrupted(work: Path, empty_mlflow_db: Path) -> Sweep:
    """fuse=auto, its process group killed with SIGKILL once configs are mid-training."""
    return stopped_and_resumed(work, empty_mlflow_db, "interrupted", "auto", signal.SIGKILL)


@pytest.fixture(scope="module")
def preempted(work: Path, empty_mlflow_db: Path) -> Sweep:
    """fuse=off, its process group sent SIGTERM once configs are mid-training, as a
    scheduler preempts a job (each config checkpoints where it is and stops)."""
    return stopped_and_resumed(work, empty_mlflow_db, "preempted", "off", signal.SIGTERM)


def stopped_and_resumed(
    work: Path, empty_mlflow_db: Path, name: str, fuse: str, signum: int
) -> Sweep:
    """A sweep slowed by the app's marker file; its process group sent ``signum`` once
    configs are mid-training; the marker deleted; the same command again."""
    sweep_dir, marker = work / name, work / f"slow-{name}"
    env = {**store_env(work, name, empty_mlflow_db), SLOW_WHILE: str(marker)}
    command = sweep_command(sweep_dir, *FURCATE, f"hydra.launcher.fuse={fuse}")
    marker.touch()
    printed = (work / f"{name}-first.log").open("wb")
    first = subprocess.Popen(
        command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=printed,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    with printed, killed_if_left(first):
        wait_for(MidTraining(sweep_dir), first, "configs mid-training", timeout=300)
        processes = [child.pid for child in psutil.Process(first.pid).children(recursive=True)]
        os.killpg(first.pid, signum)  # the launcher, its fork server and its jobs
        first.wait(timeout=120)
    assert still_alive(processes, timeout=60) == []
    at_kill = {config_of(job): attempt_in(job) for job in job_dirs(sweep_dir)}
    marker.unlink()
    done = run_cli(APP, *command[2:], cwd=work, env=env, timeout=900)
    return Sweep.read(name, sweep_dir, done, at_kill)


class MidTraining:
    """True once MID_TRAINING configs are mid-training (a checkpoint kept, not finished), or
    some are and MID_TRAINING_WAIT_S passed since the first was."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.first_seen: float | None = None

    def __call__(self) -> bool:
        count = sum(attempt_in(job).mid_training for job in job_dirs(self.sweep_dir))
        if count and self.first_seen is None:
            self.first_seen = time.monotonic()
        waited = self.first_seen is not None and time.monotonic() - self.first_seen
        return count >= MID_TRAINING or (count > 0 and waited > MID_TRAINING_WAIT_S)


def attempt_in(job: Path) -> Attempt:
    logs = [job / JobPaths.STDOUT, job / JobPaths.STDERR]
    sizes = tuple(path.stat().st_size if path.is_file() else 0 for path in logs)
    return Attempt(
        log_sizes=(sizes[0], sizes[1]),
        log=job_log(job),
        checkpoint=(job / JobPaths.CHECKPOINTS / JobPaths.CHECKPOINT_POINTER).is_file(),
        finished=recorded_status(job) == "FINISHED",
    )


def recorded_status(job: Path) -> str | None:
    """The job's status in its run_data.json (None: not there, or caught mid-write)."""
    try:
        status = json.loads((job / JobPaths.RUN_DATA).read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None
    return str(status)


def sweep_of(request: pytest.FixtureRequest, name: str) -> Sweep:
    """The module's sweep ``name``, run when a test first asks for it."""
    sweep: Sweep = request.getfixturevalue(name)
    return sweep


# -- what a config ended with -----------------------------------------------------------------


def tolerance_of(sweep: Sweep, config: Config) -> Tolerance:
    """EXACT, unless some of the config's training ran in a fused group."""
    if sweep.name == "off":
        return EXACT
    job = sweep.job(config)
    if FUSED_LINE in job_log(job):
        return FUSED
    before = sweep.at_kill.get(config)
    # killed while a group trained it: its checkpoint holds fused arithmetic (a member that
    # runs alone says so before its fit)
    if before is not None and before.mid_training and ALONE_LINE not in before.log:
        return FUSED
    return EXACT


def differences(job: Path, reference: Path, tolerance: Tolerance) -> list[str]:
    """Every way the job's outcome differs from the reference job's (empty: none)."""
    found = weight_differences(job, reference, tolerance)
    found += metric_differences(job, reference, tolerance)
    found += result_differences(job, reference, tolerance)
    found += checkpoint_differences(job, reference, tolerance)
    return found


def weight_differences(job: Path, reference: Path, tolerance: Tolerance) -> list[str]:
    if not (job / "weights.pt").is_file():
        return ["no weights.pt: the task did not finish"]
    got, want = torch.load(job / "weights.pt"), torch.load(reference / "weights.pt")
    return tensor_differences("weights.pt", got, want, tolerance)


def tensor_differences(
    what: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], tolerance: Tolerance
) -> list[str]:
    if got.keys() != want.keys():
        return [f"{what}: tensors {sorted(got)}, the reference's {sorted(want)}"]
    unequal = [name for name in want if not tolerance.tensors_close(got[name], want[name])]
    if not unequal:
        return []
    return [f"{what}: {', '.join(unequal)} differ by up to {max_difference(got, want):.3g}"]


def max_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(
        (got[name].double() - want[name].double()).abs().max().item()
        if got[name].shape == want[name].shape
        else math.inf
        for name in want
    )


def metric_rows(job: Path) -> list[list[dict[str, str]]]:
    """The rows of each of the job's CSVLogger versions (one per process that logged)."""
    versions = sorted(
        (job / "csv").glob("version_*/metrics.csv"),
        key=lambda path: int(path.parent.name.removeprefix("version_")),
    )
    return [list(csv.DictReader(path.read_text().splitlines())) for path in versions]


def metric_differences(job: Path, reference: Path, tolerance: Tolerance) -> list[str]:
    """The rows the job's CSVLogger wrote are the reference's, all of them.

    A job killed and resumed has one version per process: each earlier one a start of the
    reference's rows (it logged up to the kill, every row written as logged), the last one
    the rest from where it resumed; together all of them."""
    (want,) = metric_rows(reference)
    versions = metric_rows(job)
    if not versions:
        return ["no metrics.csv"]
    *earlier, last = versions
    if not earlier:
        found = row_differences("metrics.csv", last, want, 0, tolerance)
        if len(last) != len(want):
            found.append(f"metrics.csv: {len(last)} rows, the reference's {len(want)}")
    else:
        found = []
        for index, rows in enumerate(earlier):
            found += row_differences(f"metrics.csv version {index}", rows, want, 0, tolerance)
        start = len(want) - len(last)
        found += row_differences(
            f"metrics.csv version {len(earlier)}", last, want, start, tolerance
        )
        kept = max(len(rows) for rows in earlier)
        if kept < start:
            found.append(
                f"metrics.csv: the reference's rows {kept} to {start - 1} (of {len(want)}) "
                "are in no version"
            )
    if found:  # what of it is the reference's, row layout aside
        found.append(value_summary(versions, want, tolerance))
    return found


def cells(rows: list[dict[str, str]]) -> dict[tuple[float, str], list[float]]:
    """Each column's values at each step, in the order they were written."""
    found: dict[tuple[float, str], list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value and key not in ("epoch", "step"):
                found.setdefault((float(row["step"]), key), []).append(float(value))
    return found


def value_summary(
    versions: list[list[dict[str, str]]], want: list[dict[str, str]], tolerance: Tolerance
) -> str:
    """The job's values by (step, column) against the reference's: how many are missing, how
    many are not the reference's, and how far apart."""
    reference, got = cells(want), dict[tuple[float, str], list[float]]()
    for rows in versions:  # a later process's values at a step replace an earlier one's
        got.update(cells(rows))
    missing = [cell for cell in reference if cell not in got]
    extra = [cell for cell in got if cell not in reference]
    worst, unequal = 0.0, 0
    for cell, values in reference.items():
        if cell not in got:
            continue
        if len(got[cell]) != len(values):
            unequal += 1
            worst = math.inf
            continue
        for mine, theirs in zip(got[cell], values, strict=True):
            if not tolerance.close(mine, theirs):
                unequal += 1
                worst = max(worst, abs(mine - theirs))
    layout = "+".join(str(len(rows)) for rows in versions)
    return (
        f"metrics.csv by (step, column), {layout} rows against the reference's {len(want)}: of "
        f"its {len(reference)} values {len(missing)} missing, {unequal} unequal (up to "
        f"{worst:.3g} apart); {len(extra)} more"
    )


def row_differences(
    what: str, rows: list[dict[str, str]], want: list[dict[str, str]], start: int, tol: Tolerance
) -> list[str]:
    """``rows`` against ``want[start:]``, as far as both go (a negative start: the last
    process wrote more rows than the reference has)."""
    if start < 0:
        return [f"{what}: {len(rows)} rows, more than the reference's {len(want)}"]
    worst, first = 0.0, None
    for offset, (got, expected) in enumerate(zip(rows, want[start:], strict=False)):
        for key in sorted(got.keys() | expected.keys()):
            mine, theirs = got.get(key) or "", expected.get(key) or ""
            if mine == theirs:
                continue
            if not mine or not theirs:
                gap = math.inf
            elif key in ("epoch", "step"):  # Lightning writes the epoch 0, fused 0.0
                if float(mine) == float(theirs):
                    continue
                gap = math.inf
            elif tol.close(float(mine), float(theirs)):
                continue
            else:
                gap = abs(float(mine) - float(theirs))
            worst = max(worst, gap)
            if first is None:
                row = start + offset
                first = f"row {row} (epoch {expected.get('epoch')}, step {expected.get('step')})"
                first += f" {key}={mine or 'empty'}, the reference's {theirs or 'empty'}"
    return [] if first is None else [f"{what}: up to {worst:.3g} apart; first: {first}"]


def result_differences(job: Path, reference: Path, tolerance: Tolerance) -> list[str]:
    if not (job / "result.json").is_file():
        return ["no result.json"]
    got = json.loads((job / "result.json").read_text())["val_loss"]
    want = json.loads((reference / "result.json").read_text())["val_loss"]
    return [] if tolerance.close(got, want) else [f"returned {got!r}, the reference {want!r}"]


# what of the app's last.ckpt must be the reference's (its callbacks' and loops' states name
# the job dir, and furcate's callbacks add theirs)
CHECKPOINT_KEYS = ("epoch", "global_step", "optimizer_states", "lr_schedulers", "hyper_parameters")


def checkpoint_differences(job: Path, reference: Path, tolerance: Tolerance) -> list[str]:
    names = sorted(path.name for path in (job / "checkpoints").glob("*.ckpt"))
    want_names = sorted(path.name for path in (reference / "checkpoints").glob("*.ckpt"))
    if "last.ckpt" not in names:
        return [f"no checkpoints/last.ckpt (its checkpoints: {names})"]
    found = [] if names == want_names else [f"checkpoints {names}, the reference's {want_names}"]
    got = torch.load(job / "checkpoints" / "last.ckpt", weights_only=False)
    want = torch.load(reference / "checkpoints" / "last.ckpt", weights_only=False)
    found += tensor_differences(
        "last.ckpt state_dict", got["state_dict"], want["state_dict"], tolerance
    )
    for key in CHECKPOINT_KEYS:
        where = nested_difference(got.get(key), want.get(key), tolerance, key)
        if where:
            found.append(f"last.ckpt {where}")
    return found


def nested_difference(got: Any, want: Any, tolerance: Tolerance, where: str) -> str | None:
    """Where ``got`` first differs from ``want`` (dicts, sequences, tensors, numbers)."""
    if isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor) and tolerance.tensors_close(got, want):
            return None
        gap = max_difference({"": got}, {"": want}) if isinstance(got, torch.Tensor) else None
        return f"{where}: {got!r}, the reference's {want!r} (up to {gap})"
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return f"{where}: keys {list(got or {})}, the reference's {list(want)}"
        for key in want:
            found = nested_difference(got[key], want[key], tolerance, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(want, (list, tuple)):
        if type(got) is not type(want) or len(got) != len(want):
            return f"{where}: {got!r}, the reference's {want!r}"
        for index, (mine, theirs) in enumerate(zip(got, want, strict=True)):
            found = nested_difference(mine, theirs, tolerance, f"{where}[{index}]")
            if found:
                return found
        return None
    if isinstance(want, float) and isinstance(got, (float, int)):
        return None if tolerance.close(float(got), want) else f"{where}: {got!r}, not {want!r}"
    return None if got == want else f"{where}: {got!r}, the reference's {want!r}"


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("run", RUNS)
def test_each_config_ends_as_it_would_with_no_furcate(
    request: pytest.FixtureRequest, reference: Sweep, run: str, row: str
) -> None:
    sweep = sweep_of(request, run)
    found = []
    for variant in VARIANTS:
        config = (row, variant)
        tolerance = tolerance_of(sweep, config)
        job = sweep.job(config)
        said = "fused" if tolerance is FUSED else "alone"
        found += [
            f"{run} {row} variant={variant} ({said}; {job}): {difference}"
            for difference in differences(job, reference.job(config), tolerance)
        ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("run", ["auto", "interrupted"])
def test_under_fuse_auto_each_job_says_whether_it_trained_fused_and_why_not(
    request: pytest.FixtureRequest, run: str, row: str
) -> None:
    sweep = sweep_of(request, run)
    for variant in VARIANTS:
        job = sweep.job((row, variant))
        said = job_log(job)
        if row in ALONE_ROWS:
            assert ALONE_LINE in said and FUSED_LINE not in said, (run, row, variant, job)
        else:
            assert ALONE_LINE in said or FUSED_LINE in said, (run, row, variant, job)


def test_fuse_auto_fused_the_plain_rows(auto: Sweep) -> None:
    """The auto column compares fused training at all: the plainest rows trained fused."""
    for row in ("unshuffled", "own_generator", "sgd_nesterov"):
        for variant in VARIANTS:
            said = job_log(auto.job((row, variant)))
            assert FUSED_LINE in said, (row, variant, said[-3000:])


@pytest.mark.parametrize("run", ["interrupted", "preempted"])
def test_the_rerun_resumed_every_config_the_stop_caught_mid_training(
    request: pytest.FixtureRequest, run: str
) -> None:
    sweep = sweep_of(request, run)
    at_kill = sweep.at_kill
    stopped = [config for config, attempt in at_kill.items() if attempt.mid_training]
    assert stopped, "no config was mid-training when the sweep was stopped"
    for config in stopped:
        said = sweep.rerun_log(config)
        assert "resume from" in said, (config, said[-3000:])
    # a config recorded finished before the stop is skipped: its job prints nothing more;
    # one stopped between its run_data.json and its run's end in the store (the launcher
    # writes them in that order) is resumed at its end, and trains nothing
    for config in [config for config, attempt in at_kill.items() if attempt.finished]:
        said = sweep.rerun_log(config)
        assert said == "" or ("batch 0)" in said and "resume from" in said), (config, said)


def test_each_rows_two_configs_train_differently(reference: Sweep) -> None:
    """The matrix tests what each row varies: its two configs end with other weights."""
    same = []
    for row in ROWS:
        first, second = (
            torch.load(reference.job((row, variant)) / "weights.pt") for variant in VARIANTS
        )
        if max_difference(first, second) < 1e-3:
            same.append(row)
    assert not same, f"rows whose two configs train alike: {same}"
