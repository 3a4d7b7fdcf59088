"""Optuna at scale: ask/tell and report/should_prune against a study of 1,000 then 50,000
trials, on sqlite and on PostgreSQL, Optuna's own calls beside furcate's.

A study grows in one run: Optuna creates the storage's schema and the study; past trials go
in through Optuna's ORM tables (``TrialModel`` and its params, values and intermediate values,
as ``create_new_trial`` of a finished trial writes them: 90 % COMPLETE, 10 % PRUNED, an
intermediate value per epoch), read back with ``study.get_trials`` before anything is timed.
At each size, with a fresh storage object (cold: nothing cached in the process):

  load          ``load_study`` and its first ``get_trials``: what a rerun's sweeper and each
                pruned job pay once (Optuna caches the trials it read)
  ask/tell      ``study.ask()`` + ``study.tell()``, RandomSampler and TPESampler (median)
  furcate ask   the furcate_optuna sweeper's ``ask_owned`` (a look for WAITING trials, the
                trial created RUNNING with its owner, the sampling) + ``tell``: what it adds
  job open      what ``OptunaPruning`` does once per job: ``load_study`` + ``Trial``
  report/prune  ``trial.report`` + ``trial.should_prune`` (MedianPruner reads every finished
                trial's value at that step), median over epochs
  service       a job's report through the sweeper's prune service (the sweeper reports and
                decides on the study it holds): its first epoch, and the median of the rest

Ratios are to the same figure at 1,000 trials of the same storage, in the same run.
Run: ``python bench/optuna_scale.py`` (~10 min) writes bench/results/optuna_scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.harness import OthersCpu, machine, publish
from bench.postgres import Cluster
from bench.quiet import quiet_optuna

STUDY = "scale"
EPOCHS = 10
SPACE_JSON = json.dumps({"name": "FloatDistribution", "attributes": {"log": False, "step": None,
                         "low": 0.0, "high": 1.0}})  # fmt: skip


def grow(url: str, start: int, stop: int) -> float:
    """Trials ``start``..``stop`` of the study, finished, through Optuna's ORM tables."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    began = time.perf_counter()
    engine = sa.create_engine(url)
    rng = random.Random(start)
    t0 = datetime(2026, 1, 1)
    with engine.begin() as connection:
        study_id = connection.execute(
            sa.select(models.StudyModel.study_id).where(models.StudyModel.study_name == STUDY)
        ).scalar_one()
        for first in range(start, stop, 5000):
            numbers = range(first, min(first + 5000, stop))
            connection.execute(
                sa.insert(models.TrialModel),
                [
                    {
                        "number": n,
                        "study_id": study_id,
                        "state": "PRUNED" if n % 10 == 9 else "COMPLETE",
                        "datetime_start": t0 + timedelta(minutes=n),
                        "datetime_complete": t0 + timedelta(minutes=n + 1),
                    }
                    for n in numbers
                ],
            )
            ids = dict(
                connection.execute(
                    sa.select(models.TrialModel.number, models.TrialModel.trial_id).where(
                        models.TrialModel.study_id == study_id,
                        models.TrialModel.number >= first,
                        models.TrialModel.number < first + 5000,
                    )
                ).all()
            )
            params, values, steps = [], [], []
            for n in numbers:
                x, trial_id = rng.random(), ids[n]
                params.append(
                    {"trial_id": trial_id, "param_name": "x", "param_value": x,
                     "distribution_json": SPACE_JSON}
                )  # fmt: skip
                last = EPOCHS if n % 10 != 9 else EPOCHS // 2
                curve = [(x - 0.3) ** 2 + 1.0 / (epoch + 1) for epoch in range(last)]
                steps += [
                    {"trial_id": trial_id, "step": epoch, "intermediate_value": value,
                     "intermediate_value_type": "FINITE"}
                    for epoch, value in enumerate(curve)
                ]  # fmt: skip
                if n % 10 != 9:
                    values.append(
                        {"trial_id": trial_id, "objective": 0, "value": curve[-1],
                         "value_type": "FINITE"}
                    )  # fmt: skip
            connection.execute(sa.insert(models.TrialParamModel), params)
            connection.execute(sa.insert(models.TrialValueModel), values)
            connection.execute(sa.insert(models.TrialIntermediateValueModel), steps)
    engine.dispose()
    return time.perf_counter() - began


def median_ms(call: Callable[[], Any], repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - began)
    return round(statistics.median(seconds) * 1000, 2)


def measure(url: str, trials: int, repeats: int) -> dict[str, Any]:
    import optuna
    from optuna.distributions import FloatDistribution

    from furcate_hydra.tuning.storage import rdb_storage
    from hydra_plugins.furcate_optuna_sweeper._study import ask_owned

    space = {"x": FloatDistribution(0.0, 1.0)}
    figures: dict[str, Any] = {"trials": trials}

    def load(sampler: Any) -> Any:
        study = optuna.load_study(study_name=STUDY, storage=rdb_storage(url), sampler=sampler)
        assert len(study.get_trials(deepcopy=False)) >= trials
        return study

    began = time.perf_counter()
    load(optuna.samplers.RandomSampler())
    figures["load_ms"] = round((time.perf_counter() - began) * 1000, 1)
    for name, sampler in (
        ("random", optuna.samplers.RandomSampler(seed=0)),
        ("tpe", optuna.samplers.TPESampler(seed=0)),
    ):
        study = load(sampler)

        def plain(study: Any = study) -> None:
            trial = study.ask(space)
            study.tell(trial, trial.params["x"])

        def furcate(study: Any = study) -> None:
            trial = ask_owned(study, space, "bench-sweeper")
            study.tell(trial, trial.params["x"])

        plain()  # warm: the storage's cache holds the study's trials
        figures[f"ask_tell_{name}_ms"] = median_ms(plain, repeats)
        figures[f"furcate_ask_tell_{name}_ms"] = median_ms(furcate, repeats)
    # a job: its trial asked by the sweeper, opened and reported to as OptunaPruning does
    sweeper = load(optuna.samplers.RandomSampler())
    number = sweeper.ask(space).number
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)

    def job_open() -> Any:
        storage = rdb_storage(url, create_tables=False)
        study = optuna.load_study(
            study_name=STUDY,
            storage=storage,
            sampler=optuna.samplers.RandomSampler(),
            pruner=pruner,
        )
        study_id = storage.get_study_id_from_name(STUDY)
        return optuna.Trial(
            study, storage.get_trial_id_from_study_id_trial_number(study_id, number)
        )

    began = time.perf_counter()
    trial = job_open()
    figures["job_open_ms"] = round((time.perf_counter() - began) * 1000, 1)
    report, prune, first_prune = [], [], 0.0
    for epoch in range(EPOCHS):
        began = time.perf_counter()
        trial.report(0.5 + 1.0 / (epoch + 1), epoch)
        middle = time.perf_counter()
        trial.should_prune()
        prune.append(time.perf_counter() - middle)
        report.append(middle - began)
        if epoch == 0:
            first_prune = prune[0]
    figures["report_ms"] = round(statistics.median(report) * 1000, 2)
    figures["should_prune_ms"] = round(statistics.median(prune) * 1000, 2)
    figures["first_should_prune_ms"] = round(first_prune * 1000, 1)
    figures.update(through_the_sweeper(url, space, pruner))
    return figures


def through_the_sweeper(url: str, space: dict[str, Any], pruner: Any) -> dict[str, float]:
    """A job of a sweep on this machine: it reports each epoch to the sweeper's prune service,
    which decides on the study the sweeper holds (opened and read once per sweep, not timed
    here: that is ``load``). Per epoch: the job's report, the sweeper's report + should_prune."""
    import optuna

    from furcate_hydra.lightning import OptunaPruning
    from furcate_hydra.tuning.prune_service import PruneService
    from furcate_hydra.tuning.storage import rdb_storage

    sweeper = optuna.load_study(
        study_name=STUDY, storage=rdb_storage(url), sampler=optuna.samplers.RandomSampler(),
        pruner=pruner,
    )  # fmt: skip
    sweeper.get_trials(deepcopy=False)  # read once, as the sweeper did when it opened
    trial = sweeper.ask(space)
    service = PruneService()
    try:
        service.add(trial)
        job = OptunaPruning(url, STUDY, trial.number, "m", pruner, service_url=service.url)
        seconds = []
        for epoch in range(EPOCHS):
            began = time.perf_counter()
            job.report(0.5 + 1.0 / (epoch + 1), epoch)
            seconds.append(time.perf_counter() - began)
        assert job.service_url is not None, "the service did not answer"
    finally:
        service.stop()
        sweeper.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return {
        "service_first_report_ms": round(seconds[0] * 1000, 1),
        "service_report_ms": round(statistics.median(seconds[1:]) * 1000, 2),
    }


@contextlib.contextmanager
def storages(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'optuna.db'}"
        return
    cluster = Cluster(folder)  # folder: a child of the temp dir, which the server may pass
    with cluster.running():
        cluster.psql("postgres", "CREATE DATABASE optuna")
        yield cluster.url("optuna")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import optuna

    from furcate_hydra.tuning.storage import rdb_storage

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="furcate-optuna-scale-") as tmp:
        for kind in args.storages:
            folder = Path(tmp) / kind
            folder.mkdir()
            with storages(kind, folder) as url:
                optuna.create_study(study_name=STUDY, storage=rdb_storage(url))
                done, by_size = 0, {}
                for size in sorted(args.sizes):
                    build_s = grow(url, done, size)
                    # the measured asks add trials: the next size grows from the count now
                    by_size[str(size)] = {**measure(url, size, args.repeats), "build_s": build_s}
                    done = len(optuna.load_study(study_name=STUDY, storage=rdb_storage(url)).trials)
                    print(f"{kind} {size}: {by_size[str(size)]}", flush=True)
                results[kind] = by_size
    return results


def show(figures: dict[str, Any]) -> None:
    names = ("load_ms", "ask_tell_random_ms", "furcate_ask_tell_random_ms", "ask_tell_tpe_ms",
             "furcate_ask_tell_tpe_ms", "job_open_ms", "report_ms", "should_prune_ms",
             "first_should_prune_ms", "service_first_report_ms", "service_report_ms")  # fmt: skip
    print("| storage | trials | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for kind, by_size in figures["runs"].items():
        anchor = by_size[min(by_size, key=int)]
        for size, row in by_size.items():
            cells = [f"{row[n]} ({row[n] / anchor[n]:.2f}x)" for n in names]
            print(f"| {kind} | {size} | " + " | ".join(cells) + " |")
    print(f"others' CPU share: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 50_000])
    parser.add_argument("--storages", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    quiet_optuna()
    at_start = machine()
    others, cpu = OthersCpu(), time.process_time()
    runs = bench(args)
    figures = {"runs": runs, "others_cpu_share": others.share(time.process_time() - cpu)}
    name = "_".join(["optuna_scale", *args.storages])
    publish(name, at_start, figures, show)


if __name__ == "__main__":
    main()
