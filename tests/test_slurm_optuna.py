"""The Optuna sweeper in a Slurm job array: several launchers, one study in PostgreSQL.

``sbatch --array=0-2 --gres=gpu:1 job.sh`` runs examples/optuna_pruning in three launchers at
once, on one study (PostgreSQL) and one ``mlflow server`` (PostgreSQL too). ``n_trials`` counts
the trials of all of them, and the pruner compares a trial with the completed trials of every
launcher.
"""

from __future__ import annotations

import collections
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from bench.postgres import Cluster
from furcate_hydra.store import Tags
from hydra_plugins.furcate_optuna_sweeper._trial_runs import TrialTags
from tests.conftest import REPO
from tests.slurm_cluster import ARRAY_SWEEP_DIR, SlurmCluster, run_array, sweep_script
from tests.store_helpers import job_runs
from tests.test_store_server import Server, mlflow_server

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "optuna_pruning" / "optuna_pruning.py"
TASKS = 3
N_TRIALS = 8
EPOCHS = 4


def test_launchers_of_an_array_share_one_study(
    slurm: SlurmCluster, tmp_path: Path, postgres: Cluster
) -> None:
    (tmp_path / "server").mkdir()
    storage = postgres.create_database("optuna")
    with mlflow_server(tmp_path / "server", postgres.create_database("mlflow")) as server:
        job = submit_study(slurm, tmp_path, server, storage)
        recorded = job_runs(server.url)

    study = optuna.load_study(study_name="optuna_pruning", storage=storage)
    trials = study.get_trials(deepcopy=False)
    states = collections.Counter(t.state for t in trials)
    logs = "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("slurm-*.out"))
    untold = [
        (r.info.run_id, r.info.status, r.data.tags)
        for r in recorded
        if TrialTags.NUMBER not in r.data.tags
    ]
    assert not untold, (untold, logs)
    runs = {int(r.data.tags[TrialTags.NUMBER]): r for r in recorded}
    unfinished = [
        (t.number, t.state.name, t.datetime_start, t.system_attrs, t.user_attrs)
        for t in trials
        if not t.state.is_finished()
    ]
    assert set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}, (states, unfinished, logs)
    # n_trials counts every launcher's trials: not 3 x 8 (launchers that ask at the same
    # moment may each start the last one)
    assert N_TRIALS <= len(trials) <= N_TRIALS + TASKS - 1, (len(trials), logs)

    # each trial ran in one of the array's launchers, and all of them took some
    ran_in = {n: r.data.tags[Tags.SLURM_JOB] for n, r in runs.items()}
    assert set(ran_in) == {t.number for t in trials}, (sorted(ran_in), logs)
    assert set(ran_in.values()) == {f"{job}_{i}" for i in range(TASKS)}, ran_in

    # pruning across launchers: a trial was pruned while completed trials of another
    # launcher were in the study (the pruner compares it with them)
    pruned = [t for t in trials if t.state is TrialState.PRUNED]
    assert pruned, (states, logs)
    across = [
        p
        for p in pruned
        if any(
            c.state is TrialState.COMPLETE
            and c.datetime_complete is not None
            and p.datetime_complete is not None
            and c.datetime_complete < p.datetime_complete
            and ran_in[c.number] != ran_in[p.number]
            for c in trials
        )
    ]
    assert across, [(t.number, t.state, ran_in[t.number]) for t in trials]
    print(f"\ntrials per launcher: {collections.Counter(ran_in.values())}; {dict(states)}")


def submit_study(slurm: SlurmCluster, tmp_path: Path, server: Server, storage: str) -> str:
    script = sweep_script(
        tmp_path,
        EXAMPLE,
        server.url,
        f"hydra.sweeper.storage={storage}",
        f"hydra.sweeper.n_trials={N_TRIALS}",
        f"epochs={EPOCHS}",
        # a trial at a time per launcher, each stopped unless it beats the best tenth of the
        # completed ones: the trials after the first three are pruned but for a new best each
        # time (the median pruner, with six trials in a first wave and two after, left all
        # eight COMPLETE once in a while: sampled at random, the two may beat the median)
        "hydra.sweeper.n_jobs=1",
        "hydra/sweeper/pruner=percentile",
        "hydra.sweeper.pruner.percentile=10",
        "hydra.sweeper.pruner.n_startup_trials=1",
        # one seed in every launcher would sample the same trials in each
        "hydra.sweeper.sampler.seed=null",
        f"hydra.sweep.dir={tmp_path}/{ARRAY_SWEEP_DIR}",
    )
    return run_array(slurm, tmp_path, script, TASKS)
