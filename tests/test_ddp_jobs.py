"""Sweeps of DDP jobs: Lightning's ``ddp_spawn`` and its subprocess launcher (``strategy=ddp``)
inside furcate's jobs, on CPU with gloo, 2 ranks a job, through the real CLI and a real store.

The app (``apps/ddp_app.py``) is shaped like the most used Hydra + Lightning template: its
Trainer comes from the ``trainer`` config group (``ddp_sim``, ``ddp``) and is built with
``instantiate``; furcate reaches it through ``hydra.launcher.lightning=auto``. Each rank writes
what it saw into ``ranks.jsonl`` in its job dir.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tests.conftest import APPS, furcate_status, run_cli
from tests.process_helpers import killed_if_left, start_sweep, still_alive, wait_for
from tests.store_helpers import job_runs

pytestmark = [pytest.mark.usefixtures("mlflow_store"), pytest.mark.slow]


def ranks(job_dir: Path) -> list[dict[str, Any]]:
    """What each rank of the job in ``job_dir`` saw as it started training, in order."""
    path = job_dir / "ranks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def returned(job_dir: Path) -> Any:
    return json.loads((job_dir / "run_data.json").read_text())["return_value"]


def test_ddp_spawn_and_the_subprocess_launcher_sweep_as_one_run_per_config(
    tmp_path: Path, mlflow_store: str
) -> None:
    done = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp_sim,ddp",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count("Launching") == 1, out  # no rank started a sweep of its own
    runs = job_runs(mlflow_store)
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert all("val_loss" in r.data.metrics for r in runs)
    seen = [ranks(tmp_path / "sweep" / str(num)) for num in (0, 1)]
    for job, run in zip(
        seen, sorted(runs, key=lambda r: int(r.data.tags["furcate.job_num"])), strict=True
    ):
        assert sorted(rank["rank"] for rank in job) == [0, 1]
        assert {rank["world_size"] for rank in job} == {2}
        assert {rank["run_id"] for rank in job} == {run.info.run_id}  # the ranks of one run
    for num in (0, 1):  # what rank 0 wrote, whichever process it was
        job_dir = tmp_path / "sweep" / str(num)
        assert [row["epoch"] for row in json.loads((job_dir / "history.json").read_text())] == [
            0,
            1,
            2,
        ]
        assert (job_dir / "final.ckpt").is_file() and list((job_dir / "plots").iterdir())
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "outputs").exists()
    rerun = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp_sim,ddp",
        f"hydra.sweep.dir={tmp_path / 'again'}",
        cwd=tmp_path,
    )
    assert rerun.returncode == 0 and "2 skipped" in rerun.stdout + rerun.stderr
    assert len(job_runs(mlflow_store)) == 2
    status = furcate_status(tmp_path / "sweep", cwd=tmp_path)
    assert "FINISHED 2" in status  # a job a line, whatever its ranks
    assert len([line for line in status.splitlines() if "trainer=" in line]) == 3  # + command


@pytest.mark.parametrize(
    ("flags", "width"),
    [(["-cn", "wide"], 48), (["--config-dir=more", "-cn=narrow"], 8)],
    ids=["config-name", "config-dir"],
)
def test_every_rank_composes_the_primary_config_the_app_was_started_with(
    tmp_path: Path, mlflow_store: str, flags: list[str], width: int
) -> None:
    # a config dir relative to the working dir, whose primary config extends the app's
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "narrow.yaml").write_text("defaults: [config, _self_]\nwidth: 8\n")
    done = run_cli(
        APPS / "ddp_app.py",
        "-m",
        *flags,
        "trainer=ddp",
        "trainer.max_epochs=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    (run,) = job_runs(mlflow_store)
    assert run.info.status == "FINISHED"
    seen = ranks(tmp_path / "sweep" / "0")
    assert sorted(rank["rank"] for rank in seen) == [0, 1]
    assert {rank["width"] for rank in seen} == {width}  # rank 1 composed it too
    if flags[0] != "-cn":
        return
    # the reference: the app run alone with the same flags, no furcate (a single run)
    (tmp_path / "alone").mkdir()
    alone = run_cli(
        APPS / "ddp_app.py", *flags, "trainer=ddp", "trainer.max_epochs=1",
        "hydra.run.dir=run", cwd=tmp_path / "alone",
    )  # fmt: skip
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-4000:]
    mine, theirs = (
        torch.load(d / "weights.pt") for d in (tmp_path / "sweep" / "0", tmp_path / "alone")
    )
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_a_trainer_asking_more_gpus_than_its_slot_has_fails_naming_gpus_per_job(
    tmp_path: Path,
) -> None:
    # GPU 0 declared (no hardware needed: the check comes before Lightning looks for it)
    done = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp",
        "trainer.accelerator=gpu",
        "hydra.launcher.gpus=[0]",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Invalid hydra.launcher.gpus_per_job=1" in out, out
    assert "asks for 2 GPUs" in out and "set hydra.launcher.gpus_per_job=2" in out


def test_every_rank_resumes_from_one_checkpoint_after_the_launcher_was_killed(
    tmp_path: Path, mlflow_store: str
) -> None:
    options = ["trainer=ddp", "lr=0.05,0.1", "epoch_sleep=3"]
    checkpoint = tmp_path / "sweep" / "0" / "resume" / "last.json"
    with killed_if_left(start_sweep("ddp_app.py", tmp_path, *options)) as process:
        wait_for(checkpoint.exists, process, "the first epoch's checkpoint", 180)
        # everything at once, as a power cut: the launcher, its fork server, every rank
        tree = [process.pid, *(c.pid for c in psutil.Process(process.pid).children(True))]
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        process.wait()
    again = run_cli(
        APPS / "ddp_app.py", "-m", f"hydra.sweep.dir={tmp_path / 'again'}", *options, cwd=tmp_path
    )
    assert again.returncode == 0, again.stdout + again.stderr
    reference = run_cli(
        APPS / "ddp_app.py",
        "-m",
        f"hydra.sweep.dir={tmp_path / 'reference'}",
        "trainer=ddp",
        "lr=0.05",
        "hydra.launcher.mlflow.enabled=false",
        cwd=tmp_path,
    )
    assert reference.returncode == 0, reference.stdout + reference.stderr
    resumed = ranks(tmp_path / "again" / "0")
    assert sorted(rank["rank"] for rank in resumed) == [0, 1]
    steps = {rank["global_step"] for rank in resumed}
    assert len(steps) == 1 and steps.pop() > 0  # both ranks, from the same checkpoint
    assert returned(tmp_path / "again" / "0")["weights"] == pytest.approx(
        returned(tmp_path / "reference" / "0")["weights"], abs=1e-6
    )
    assert {r.info.status for r in job_runs(mlflow_store)} == {"FINISHED"}
    assert len(job_runs(mlflow_store)) == 2  # resumed in their runs, not new ones


def test_ctrl_c_leaves_no_rank_behind(tmp_path: Path) -> None:
    options = ["trainer=ddp,ddp_sim", "epoch_sleep=4"]
    with killed_if_left(start_sweep("ddp_app.py", tmp_path, *options)) as process:
        wait_for(
            lambda: (
                len(ranks(tmp_path / "sweep" / "0")) + len(ranks(tmp_path / "sweep" / "1")) == 4
            ),
            process,
            "every rank training",
            180,
        )
        tree = [c.pid for c in psutil.Process(process.pid).children(True)]
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT
    assert still_alive(tree, timeout=20) == []


@pytest.mark.parametrize(("trainer", "signum"), [("ddp", "SIGTERM"), ("ddp_sim", "SIGUSR1")])
def test_a_preemption_signal_to_a_ddp_job_queues_it_again_and_every_rank_resumes(
    tmp_path: Path, mlflow_store: str, trainer: str, signum: str
) -> None:
    options = [f"trainer={trainer}", "epoch_sleep=3", "shuffle=true"]
    job_dir = tmp_path / "sweep" / "0"
    checkpoint = job_dir / "resume" / "last.json"
    with killed_if_left(start_sweep("ddp_app.py", tmp_path, *options)) as process:
        wait_for(checkpoint.exists, process, "the first epoch's checkpoint", 180)
        job = psutil.Process(process.pid).children(recursive=True)
        # the job's own process: the fork server's child that leads its session
        (leader,) = [p for p in job if os.getsid(p.pid) == p.pid and p.name() == "furcate-job"]
        leader.send_signal(signal.Signals[signum])  # a scheduler preempting the job
        _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err.decode()
    (run,) = job_runs(mlflow_store)
    assert run.info.status == "FINISHED" and run.data.tags["furcate.preemptions"] == "1"
    first, second = ranks(job_dir)[:2], ranks(job_dir)[2:]
    assert sorted(r["rank"] for r in first) == sorted(r["rank"] for r in second) == [0, 1]
    assert {r["global_step"] for r in first} == {0}
    steps = {r["global_step"] for r in second}
    assert len(steps) == 1 and steps.pop() > 0  # both ranks, from the one checkpoint
    # each rank's shuffled order replayed where it stopped: the weights of the job never
    # stopped (its own store: the finished config would be skipped)
    alone = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'alone.db'}"}
    done = run_cli(
        APPS / "ddp_app.py", "-m", *options, f"hydra.sweep.dir={tmp_path / 'alone'}",
        cwd=tmp_path, env={**os.environ, **alone},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    resumed, never = (torch.load(d / "weights.pt") for d in (job_dir, tmp_path / "alone" / "0"))
    assert all(torch.equal(resumed[name], never[name]) for name in never)


def rank_pids(sweep: Path) -> list[int]:
    jobs = sorted(sweep.iterdir()) if sweep.is_dir() else []
    return [rank["pid"] for job in jobs if job.is_dir() for rank in ranks(job)]


def test_a_failed_rank_fails_its_job_and_leaves_no_rank_behind(tmp_path: Path) -> None:
    done = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp,ddp_sim",
        "fail_rank=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "2 failed" in out, out
    pids = rank_pids(tmp_path / "sweep")
    assert len(pids) == 4 and still_alive(pids, timeout=20) == []


def test_a_killed_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    with killed_if_left(
        start_sweep("ddp_app.py", tmp_path, "trainer=ddp,ddp_sim", "epoch_sleep=4")
    ) as process:
        wait_for(lambda: len(rank_pids(sweep)) == 4, process, "every rank training", 180)
        os.kill(process.pid, signal.SIGKILL)  # the launcher alone: its jobs must not outlive it
        process.wait()
        assert still_alive(rank_pids(sweep), timeout=30) == []


def test_optuna_prunes_a_ddp_trial_on_every_rank_at_once(tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    done = run_cli(
        APPS / "ddp_app.py",
        "-m",
        "trainer=ddp",
        "trainer.max_epochs=4",
        "returns=val_loss",
        "hydra/sweeper=furcate_optuna",
        "hydra/sweeper/pruner=percentile",
        "hydra.sweeper.pruner.percentile=50",
        "hydra.sweeper.pruner.n_startup_trials=1",
        "hydra.sweeper.pruner.n_warmup_steps=0",
        "hydra.sweeper.monitor=val_loss",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.sampler.seed=3",
        "lr=interval(0.001, 0.2)",
        f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.load_study(
        study_name=summary.study_name, storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )
    states = [trial.state for trial in study.trials]
    assert TrialState.PRUNED in states and set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    for trial in study.trials:
        if trial.state is TrialState.PRUNED:  # stopped at the epoch the pruner named
            assert len(trial.intermediate_values) < 4, trial
