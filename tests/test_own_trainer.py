"""An app that builds its own Trainer, callbacks and loggers (``examples/own_trainer``, laid out
like the Hydra + Lightning template) gets resume, preemption, pruning, progress and MLflow
metrics with no edit, whichever Lightning namespace it is written in.

The example is written ``import lightning as L``; its ``pytorch_lightning`` twin is the same
files with the imports and ``_target_``s rewritten, as Lightning makes its two packages. Every
sweep runs through the real Hydra CLI in a subprocess, recording into the test's sqlite store.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from furcate_hydra import env_vars
from furcate_hydra.layout import JobPaths
from furcate_hydra.store import Tags
from tests.conftest import REPO, run_cli
from tests.process_helpers import still_alive, wait_for
from tests.store_helpers import all_runs, job_runs

EXAMPLE = REPO / "examples" / "own_trainer"
NAMESPACES = ["lightning.pytorch", "pytorch_lightning"]
FURCATE = "hydra/launcher=furcate"
# slow epochs (12 batches of ~0.3 s) and a checkpoint every 2 steps: a job stopped mid-epoch
# resumes from within it
SLOW = [
    "data.sample_sleep=0.01",
    "trainer.max_epochs=3",
    "hydra.launcher.checkpoint_every_n_steps=2",
]


def app_in(namespace: str, tmp_path: Path) -> Path:
    """The example's ``src/train.py``: as shipped for ``lightning.pytorch``; for
    ``pytorch_lightning``, a copy with the imports and targets of that namespace."""
    if namespace == "lightning.pytorch":
        return EXAMPLE / "src" / "train.py"
    copy = tmp_path / "app"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__", "logs", "*.md"))
    for path in copy.rglob("*"):
        if path.suffix in (".py", ".yaml"):
            text = path.read_text().replace(
                "import lightning as L", "import pytorch_lightning as L"
            )
            path.write_text(text.replace("lightning.pytorch.", "pytorch_lightning."))
    assert "import lightning" not in (copy / "src" / "train.py").read_text()
    return copy / "src" / "train.py"


def sweep(app: Path, work: Path, *overrides: str, env: dict[str, str] | None = None) -> Path:
    """``python src/train.py -m <overrides>`` in ``work``, exiting 0: its sweep dir."""
    work.mkdir(exist_ok=True)
    before = set(sweep_dirs(work))
    result = run_cli(
        app, "-m", FURCATE, *overrides, cwd=work, env=None if env is None else {**os.environ, **env}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (made,) = set(sweep_dirs(work)) - before
    return made


def sweep_dirs(work: Path) -> list[Path]:
    return sorted((work / "logs" / "train" / "multiruns").glob("*"))


def job_log(job_dir: Path) -> str:
    return "".join((job_dir / name).read_text() for name in ("stdout.log", "stderr.log"))


def metric_history(uri: str, run_id: str, key: str) -> list[float]:
    from mlflow.tracking import MlflowClient

    return [m.value for m in MlflowClient(uri).get_metric_history(run_id, key)]


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_every_metric_the_app_logs_lands_in_its_jobs_run(
    tmp_path: Path, mlflow_store: str, namespace: str
) -> None:
    app, work = app_in(namespace, tmp_path), tmp_path / "work"
    # both loggers the app offers, in one sweep: a job per (logger, lr)
    sweep_dir = sweep(app, work, "logger=csv,mlflow", "model.lr=0.05,0.1", "trainer.max_epochs=2")

    runs = job_runs(mlflow_store)
    # one run per job, whichever logger the app chose, and no store of the logger's own
    assert len(runs) == 4 and len(all_runs(mlflow_store)) == 5
    assert not (work / "logs" / "mlflow").exists() and not (work / "mlruns").exists()
    assert not (work / "lightning_logs").exists()  # the job's files are in its own dir
    loggers = []
    for run in runs:
        assert run.info.status == "FINISHED"
        assert len(metric_history(mlflow_store, run.info.run_id, "val/acc")) == 2
        assert {"train/loss", "train/acc", "val/loss", "test/acc"} <= run.data.metrics.keys()
        # the app logged these hyperparameters its own way ('dev' list, None); the launcher's
        # values stay and nothing failed
        assert (run.data.params["tags"], run.data.params["ckpt_path"]) == ('["dev"]', "null")
        job_dir = Path(run.data.tags[Tags.OUTPUT_DIR])
        assert job_dir.parent == sweep_dir
        said = [line for line in job_log(job_dir).splitlines() if "furcate: the app's" in line]
        assert len(said) == 1, job_log(job_dir)
        assert f"the app's {namespace} Trainer gets a fresh start" in said[0]
        (logger,) = [o for o in run.data.tags[Tags.OVERRIDES].split() if o.startswith("logger=")]
        loggers.append(logger)
        if logger == "logger=mlflow":
            assert "the app's MLFlowLogger, bound to it; its experiment_name=" in said[0]
        else:
            assert "an MLFlowLogger added beside CSVLogger" in said[0]
            assert list(job_dir.glob("csv/version_*/metrics.csv"))
        history = json.loads((job_dir / JobPaths.HISTORY).read_text())
        assert [row["epoch"] for row in history] == [0, 1]
        assert (job_dir / JobPaths.PROGRESS).is_file() and (job_dir / "final.ckpt").is_file()
        assert (job_dir / JobPaths.CHECKPOINTS / "last.json").is_file()
        assert (job_dir / "checkpoints" / "last.ckpt").is_file()  # the app's own, untouched
    assert sorted(loggers) == ["logger=csv"] * 2 + ["logger=mlflow"] * 2


@pytest.mark.slow  # CI runs it: a sweep interrupted, run again, and a reference sweep
def test_kill_9_of_the_launcher_mid_epoch_then_the_same_command_ends_as_if_never_stopped(
    tmp_path: Path, mlflow_store: str
) -> None:
    # lightning.pytorch here, pytorch_lightning in the SIGTERM test below: each namespace
    # resumes a job mid-epoch from its checkpoint (three sweeps a namespace took a minute)
    import torch

    app, work = app_in("lightning.pytorch", tmp_path), tmp_path / "work"
    work.mkdir()
    command = [sys.executable, str(app), "-m", FURCATE, *SLOW]
    first = subprocess.Popen(
        command, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: saved_mid_epoch(work), first, "a checkpoint within epoch 1")
    jobs = [child.pid for child in psutil.Process(first.pid).children(recursive=True)]
    assert jobs, "expected the fork server and the running job"
    first.kill()  # the launcher alone, as the OOM killer would
    first.wait(timeout=60)
    # the fork server notices its launcher is gone and stops every job
    assert still_alive(jobs, timeout=30) == []
    (old_dir,) = sweep_dirs(work)
    old_files = sorted(p.name for p in (old_dir / "0" / "checkpoints").iterdir())

    new_dir = sweep(app, work, *SLOW)
    new_job = new_dir / "0"
    log = job_log(new_job)
    said = next(line for line in log.splitlines() if "furcate: the app's" in line)
    assert f"resume from {old_dir / '0' / JobPaths.CHECKPOINTS}/epoch=0001-step=" in said, said
    assert "(epoch 1, batch 0)" not in said  # within the epoch, not at its start
    assert "not empty" not in log and "dirpath has changed" not in log
    assert not list(new_job.glob("checkpoints/*-v1.ckpt"))
    # the old sweep's files are as they were
    assert sorted(p.name for p in (old_dir / "0" / "checkpoints").iterdir()) == old_files

    reference = sweep(app, tmp_path / "reference", *SLOW, env=reference_store(tmp_path))
    resumed = torch.load(new_job / "final.ckpt", weights_only=False)
    never_stopped = torch.load(reference / "0" / "final.ckpt", weights_only=False)
    for key, value in never_stopped["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key
    # the app's ModelCheckpoint continues in the new job dir: its best path is valid there
    (state,) = [v for k, v in resumed["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert state["dirpath"] == str(new_job / "checkpoints")
    assert Path(state["best_model_path"]).parent == new_job / "checkpoints"
    assert all(Path(path).is_file() for path in state["best_k_models"])

    (run,) = job_runs(mlflow_store)
    assert run.info.status == "FINISHED" and run.data.tags[Tags.RESUMED] == "1"
    assert len(metric_history(mlflow_store, run.info.run_id, "val/acc")) == 3


@pytest.mark.slow  # CI runs it
def test_sigterm_to_a_job_requeues_it_and_it_finishes_from_its_checkpoint(
    tmp_path: Path, mlflow_store: str
) -> None:
    app, work = app_in("pytorch_lightning", tmp_path), tmp_path / "work"
    work.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, str(app), "-m", FURCATE, *SLOW], cwd=work, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: saved_mid_epoch(work), launcher, "a checkpoint within epoch 1")
    (sweep_dir,) = sweep_dirs(work)
    pid = json.loads((sweep_dir / "0" / JobPaths.RUN_DATA).read_text())["pid"]
    os.kill(pid, signal.SIGTERM)  # a scheduler's, not the launcher's
    out, _ = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, out
    assert "preempted by SIGTERM" in out and "queued again to resume" in out
    (run,) = job_runs(mlflow_store)
    assert run.info.status == "FINISHED" and run.data.tags[Tags.PREEMPTIONS] == "1"
    log = job_log(sweep_dir / "0")
    assert "resume from" in log and "not empty" not in log
    history = json.loads((sweep_dir / "0" / JobPaths.HISTORY).read_text())
    assert [row["epoch"] for row in history] == [0, 1, 2]


@pytest.mark.slow  # CI runs it: ten short trials
def test_the_optuna_sweepers_monitor_alone_prunes_trials_of_an_unchanged_app(
    tmp_path: Path, mlflow_store: str
) -> None:
    import optuna

    app, work = app_in("lightning.pytorch", tmp_path), tmp_path / "work"
    work.mkdir()
    # the app's own hparams_search config (hydra-optuna-sweeper's, edited in two lines)
    result = run_cli(
        app, "hparams_search=optuna", FURCATE, "hydra.sweeper.monitor=val/acc",
        "model.lr=tag(log, interval(0.00001, 0.1))", "test=false", "hydra.sweeper.n_trials=10",
        "hydra.sweeper.pruner.n_startup_trials=3", cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (sweep_dir,) = sweep_dirs(work)
    study = optuna.load_study(study_name="train", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    states = [trial.state for trial in study.trials]
    assert len(states) == 10 and optuna.trial.TrialState.PRUNED in states, states
    assert "Optuna pruning on 'val/acc'" in job_log(sweep_dir / "0")


def test_a_callback_of_the_other_namespace_is_refused_naming_its_twin(
    tmp_path: Path, mlflow_store: str
) -> None:
    app, work = app_in("lightning.pytorch", tmp_path), tmp_path / "work"
    work.mkdir()
    wrong = "pytorch_lightning.callbacks.ModelCheckpoint"
    result = run_cli(
        app, "-m", FURCATE, "trainer.max_epochs=1", f"callbacks.model_checkpoint._target_={wrong}",
        cwd=work,
    )  # fmt: skip
    assert result.returncode != 0
    (sweep_dir,) = sweep_dirs(work)
    log = job_log(sweep_dir / "0")
    assert (
        "Invalid Trainer(callbacks=...)='pytorch_lightning.callbacks.model_checkpoint."
        "ModelCheckpoint': it is a `pytorch_lightning` class, but the Trainer is a "
        "`lightning.pytorch` Trainer" in log
    ), log
    assert "Fix: use lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint instead" in log
    (run,) = job_runs(mlflow_store)
    assert run.info.status == "FAILED"


def test_lightning_off_leaves_the_apps_trainer_alone(tmp_path: Path, mlflow_store: str) -> None:
    app, work = app_in("lightning.pytorch", tmp_path), tmp_path / "work"
    sweep_dir = sweep(app, work, "trainer.max_epochs=1", "hydra.launcher.lightning=off")
    job_dir = sweep_dir / "0"
    assert "furcate: the app's" not in job_log(job_dir)
    assert not (job_dir / JobPaths.CHECKPOINTS).exists() and not (job_dir / "final.ckpt").exists()
    (run,) = job_runs(mlflow_store)
    # the pool, the run and its record as for any task; no metric unless the app logs one
    assert run.info.status == "FINISHED" and not run.data.metrics
    assert (job_dir / "checkpoints" / "last.ckpt").is_file()


# -- helpers -----------------------------------------------------------------------------


def saved_mid_epoch(work: Path) -> bool:
    """furcate saved a checkpoint within epoch 1 of the newest sweep's job 0."""
    dirs = sweep_dirs(work)
    pointer = dirs[-1] / "0" / JobPaths.CHECKPOINTS / "last.json" if dirs else None
    if pointer is None or not pointer.exists():
        return False
    saved = json.loads(pointer.read_text())
    return bool(saved["epoch"] >= 1 and saved["batch"])


def reference_store(tmp_path: Path) -> dict[str, str]:
    """A store of its own for the sweep that is never stopped (else it would skip)."""
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'reference.db'}"}


@pytest.mark.parametrize(
    ("imports", "mode", "preload", "expected"),
    [
        ("import lightning as L", "auto", None, "('furcate_hydra.lightning._own_trainer',)"),
        ("import pytorch_lightning", "auto", None, "('furcate_hydra.lightning._own_trainer',)"),
        ("import torch", "auto", None, "()"),  # a task that never imports Lightning
        (
            "import torch",
            "auto",
            ["pytorch_lightning"],
            "('furcate_hydra.lightning._own_trainer',)",
        ),
        ("import lightning as L", "off", None, "()"),
    ],
)
def test_the_fork_server_imports_the_lightning_layer_once_for_every_job(
    imports: str, mode: str, preload: list[str] | None, expected: str
) -> None:
    # ~0.2 s a job otherwise (the handoff benchmark found it): the server imports it where
    # the launcher's process has the app's Lightning, or preload names it
    code = (
        f"{imports}\nfrom furcate_hydra.job_process.lightning_auto import server_imports\n"
        f"print(server_imports({mode!r}, {preload!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == expected, result.stderr


@pytest.mark.parametrize("first", ["furcate_hydra.lightning", "lightning.pytorch"])
def test_a_task_may_import_furcates_lightning_layer_before_any_lightning(first: str) -> None:
    """A task that imports furcate_hydra.lightning inside its function (after the fork, with
    no Lightning imported yet): its own import of Lightning meets the job's import hook
    mid-import, and the Trainer is patched once the layer is whole (it failed with a circular
    import before)."""
    code = (
        "from furcate_hydra.job_process.lightning_auto import install_for_job\n"
        "install_for_job()\n"
        f"import {first}\n"
        "import lightning.pytorch, pytorch_lightning\n"
        "from furcate_hydra.lightning import OptunaPruning\n"
        "from furcate_hydra.lightning._own_trainer import _installed\n"
        "print(sorted(_installed))\n"
    )
    env = {**os.environ, env_vars.LIGHTNING: "auto"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "['lightning.pytorch', 'pytorch_lightning']"
