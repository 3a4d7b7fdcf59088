"""Optuna storages for jobs on several machines: what pruning costs against each, in one run.

A sweep with pruning has two kinds of clients of its study's storage:

  sweeper   ask a trial ──► hand it to a job ──► the job's result ──► tell ──► ask the next
  job       open its trial (load_study, the trial's id) ──► per epoch: report + should_prune

Here N job-like processes (spawned, each opening the storage as ``OptunaPruning`` does) run
the job's side against every candidate while this process asks and tells as the sweeper does.
Every job runs every epoch (it asks ``should_prune`` but does not stop), so each candidate
does the same work; ``--epoch-s`` is the time an epoch "trains" (0: back-to-back, the most
contention). Candidates:

  sqlite    the anchor: the launcher's sqlite file, opened by every process (what
            ``hydra.sweeper.storage=sqlite:///optuna.db`` does on one machine)
  grpc      Optuna's gRPC storage proxy (``make_server`` in a thread of the sweeper's
            process, in front of that sqlite file); jobs use ``GrpcStorageProxy`` on 127.0.0.1
  grpc-process  the same proxy in a process of its own (no GIL shared with the sweeper)
  journal   ``JournalStorage(JournalFileBackend(path))``: a file every process appends to
            (the set-up for a shared file system)
  postgres  an RDB server: a PostgreSQL of this machine started for the run on a loopback
            port (``initdb``/``pg_ctl`` in a temp dir, as the ``postgres`` user when run as
            root), psycopg2; skipped with a note when ``pg_ctl`` or psycopg2 is missing

Correctness per candidate: every trial COMPLETE, every report stored with its value, and the
errors the operations raised (``database is locked`` among them; each is retried as
``OptunaPruning`` retries it). Latencies and ops/s are compared with the sqlite anchor of the
same run. Run: ``python bench/optuna_storage.py`` (~3 min; ``--jobs 4 16``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.postgres import Cluster, free_port
from bench.quiet import quiet_optuna

T = TypeVar("T")

STUDY = "bench"
CANDIDATES = ("sqlite", "grpc", "grpc-process", "journal", "postgres")
# As OptunaPruning: a refused write is tried again, at most this many times in all.
_ATTEMPTS = 5


@dataclass(frozen=True)
class Target:
    """How a process opens one candidate's storage (picklable: it goes to the jobs)."""

    kind: str  # one of CANDIDATES
    address: str  # a URL, a journal file, or host:port of the gRPC proxy
    sqlite: str = ""  # behind the gRPC proxy: the file's URL, which the sweeper opens

    def open(self, *, sweeper: bool) -> Any:
        import optuna

        from furcate_hydra.tuning.storage import rdb_storage

        if self.kind in ("sqlite", "postgres"):
            return rdb_storage(self.address, create_tables=sweeper)
        if self.kind.startswith("grpc") and sweeper:  # the sweeper opens the file itself
            return rdb_storage(self.sqlite, create_tables=False)
        if self.kind == "journal":
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(self.address))
        host, _, port = self.address.rpartition(":")
        proxy = optuna.storages.GrpcStorageProxy(host=host, port=int(port))
        proxy.wait_server_ready(timeout=30)
        return proxy


@dataclass
class Ops:
    """Seconds per call of each operation, and the errors the calls raised."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    lost: int = 0  # calls that failed every attempt

    def call(self, name: str, work: Callable[[], T]) -> T | None:
        """``work()``, timed over all its attempts; retried as ``OptunaPruning`` retries."""
        began = time.perf_counter()
        for attempt in range(_ATTEMPTS):
            try:
                value = work()
            except Exception as exc:
                self.errors.append(f"{name}: {type(exc).__name__}: {exc} {exc.__cause__ or ''}")
                time.sleep(0.05 * 2 ** (attempt + 1))
                continue
            self.seconds.setdefault(name, []).append(time.perf_counter() - began)
            return value
        self.lost += 1
        return None

    def merge(self, other: Ops) -> None:
        for name, values in other.seconds.items():
            self.seconds.setdefault(name, []).extend(values)
        self.errors.extend(other.errors)
        self.lost += other.lost


def reported(trial_number: int, epoch: int) -> float:
    """The value a trial reports at an epoch: known to the check at the end."""
    return 1.0 / (epoch + 1) + 0.001 * trial_number


def job(target: Target, epochs: int, epoch_s: float, tasks: Any, results: Any) -> None:
    """A job process: for each trial number it gets, what a pruned Lightning trial does."""
    quiet_optuna()
    import optuna

    storage = target.open(sweeper=False)
    results.put(("ready", os.getpid()))
    ops = Ops()
    while (number := tasks.get()) is not None:

        def open_trial(number: int = number) -> optuna.Trial:
            study = optuna.load_study(
                study_name=STUDY,
                storage=storage,
                sampler=optuna.samplers.RandomSampler(),
                pruner=optuna.pruners.MedianPruner(n_startup_trials=0, n_warmup_steps=0),
            )
            study_id = storage.get_study_id_from_name(STUDY)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            return optuna.Trial(study, trial_id)

        trial = ops.call("open", open_trial)
        prunes = 0
        for epoch in range(epochs):
            if epoch_s:
                time.sleep(epoch_s)
            if trial is None:
                break
            ops.call("report", functools.partial(trial.report, reported(number, epoch), epoch))
            prunes += bool(ops.call("should_prune", trial.should_prune))
        results.put(("done", (number, reported(number, epochs - 1), prunes)))
    results.put(("ops", ops))


def run_candidate(
    target: Target, jobs: int, trials_per_job: int, epochs: int, epoch_s: float
) -> dict[str, Any]:
    """One candidate: ``jobs`` processes, ``jobs * trials_per_job`` trials asked and told."""
    import optuna
    from optuna.distributions import BaseDistribution, FloatDistribution

    storage = target.open(sweeper=True)
    study = optuna.create_study(
        storage=storage, study_name=STUDY, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    tasks, results = context.Queue(), context.Queue()
    workers = [
        context.Process(target=job, args=(target, epochs, epoch_s, tasks, results))
        for _ in range(jobs)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:  # every job has imported Optuna and opened the storage
        kind, _ = results.get(timeout=300)
        assert kind == "ready", kind
    sweeper = Ops()
    space: dict[str, BaseDistribution] = {"x": FloatDistribution(0.0, 1.0)}
    trials: dict[int, optuna.Trial] = {}
    total = jobs * trials_per_job
    prunes = 0
    began = time.perf_counter()

    def ask() -> None:
        trial = sweeper.call("ask", lambda: study.ask(space))
        if trial is not None:
            trials[trial.number] = trial
            tasks.put(trial.number)

    for _ in range(min(jobs, total)):
        ask()
    told = 0
    while told < len(trials):
        kind, payload = results.get(timeout=600)
        number, value, said_prune = payload
        prunes += said_prune
        sweeper.call("tell", functools.partial(study.tell, trials[number], value))
        told += 1
        if len(trials) < total:
            ask()
    wall = time.perf_counter() - began
    for _ in workers:
        tasks.put(None)
    ops = Ops()
    for _ in workers:
        kind, payload = results.get(timeout=120)
        assert kind == "ops", kind
        ops.merge(payload)
    for worker in workers:
        worker.join(timeout=60)
    ops.merge(sweeper)
    figures = summary(ops, wall, check(study, trials, epochs), prunes)
    with contextlib.suppress(Exception):
        storage.remove_session()  # RDB: close the sweeper's connections before the server stops
    return figures


def check(study: Any, asked: dict[int, Any], epochs: int) -> dict[str, int]:
    """What the storage holds after the run, against what was reported and told."""
    from optuna.trial import TrialState

    stored = {t.number: t for t in study.get_trials(deepcopy=False)}
    missing = wrong = 0
    for number in asked:
        trial = stored.get(number)
        values = trial.intermediate_values if trial is not None else {}
        for epoch in range(epochs):
            if epoch not in values:
                missing += 1
            elif values[epoch] != reported(number, epoch):
                wrong += 1
    complete = sum(t.state == TrialState.COMPLETE for t in stored.values())
    return {"trials": len(asked), "complete": complete, "missing_reports": missing, "wrong": wrong}


def summary(ops: Ops, wall: float, checked: dict[str, int], prunes: int) -> dict[str, Any]:
    from bench.harness import summarize

    job_ops = len(ops.seconds.get("report", [])) + len(ops.seconds.get("should_prune", []))
    locked = sum("database is locked" in error for error in ops.errors)
    return {
        "wall_s": round(wall, 2),
        "job_ops_per_s": round(job_ops / wall, 1),
        "trials_per_s": round(checked["trials"] / wall, 2),
        "ops": {name: summarize(values) for name, values in sorted(ops.seconds.items())},
        "check": checked,
        "should_prune_true": prunes,
        "errors": len(ops.errors),
        "locked_errors": locked,
        "lost_calls": ops.lost,
        "first_errors": ops.errors[:3],
    }


def proxy_server(url: str, port: int) -> Any:
    """Optuna's gRPC proxy in front of the sqlite storage at ``url``, on 127.0.0.1, started."""
    import optuna
    from optuna.storages._grpc.server import make_server

    from furcate_hydra.tuning.storage import rdb_storage

    # Optuna's advice for the proxy: the cached storage (finished trials read once)
    server = make_server(optuna.storages.get_storage(rdb_storage(url)), "127.0.0.1", port)
    server.start()
    return server


def serve(url: str, port: int) -> None:
    """The proxy's own process: serves until it is terminated."""
    proxy_server(url, port).wait_for_termination()


@contextlib.contextmanager
def grpc_proxy(url: str, own_process: bool) -> Iterator[str]:
    port = free_port()
    if not own_process:
        server = proxy_server(url, port)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(grace=5).wait()
        return
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(url, port))
    process.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join(timeout=10)


@contextlib.contextmanager
def postgres(folder: Path, user: str) -> Iterator[str]:
    """A PostgreSQL server of its own in ``folder`` on a loopback port; stopped on exit."""
    cluster = Cluster(folder, user, fsync="on")
    with cluster.running():
        cluster.psql("postgres", "CREATE DATABASE optuna")
        yield cluster.url("optuna")


@contextlib.contextmanager
def target_of(kind: str, folder: Path, pg_user: str) -> Iterator[Target]:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "sqlite":
        yield Target(kind, f"sqlite:///{folder / 'optuna.db'}")
    elif kind in ("grpc", "grpc-process"):
        url = f"sqlite:///{folder / 'optuna.db'}"
        Target("sqlite", url).open(sweeper=True)  # the tables, before the proxy reads them
        with grpc_proxy(url, own_process=kind == "grpc-process") as address:
            yield Target(kind, address, sqlite=url)
    elif kind == "journal":
        yield Target(kind, str(folder / "journal.log"))
    else:
        with postgres(folder, pg_user) as url:
            yield Target(kind, url)


def show(figures: dict[str, Any]) -> None:
    print(f"{figures['epochs']} epochs per trial, {figures['trials_per_job']} trials per job, ")
    print(f"epoch time {figures['epoch_s']} s; ratios to sqlite in the same run")
    for jobs, by_kind in figures["runs"].items():
        print(f"\n{jobs} jobs")
        head = f"{'storage':<9} {'ops/s':>8} {'x':>6}"
        names = ("open", "report", "should_prune", "ask", "tell")
        head += "".join(f" {name + ' ms':>20}" for name in names)
        print(head + "  check")
        for kind, result in by_kind.items():
            if "skipped" in result:
                print(f"{kind:<9} skipped: {result['skipped']}")
                continue
            line = f"{kind:<9} {result['job_ops_per_s']:>8} {result['ops_ratio']:>6}"
            for name in names:
                op = result["ops"].get(name)
                cell = f"{op['median_ms']}/{op['p90_ms']}" if op else "-"
                ratio = result["median_ratio"].get(name)
                line += f" {cell + ('' if ratio is None else f' ({ratio})'):>20}"
            c = result["check"]
            line += (
                f"  {c['complete']}/{c['trials']} complete, {c['missing_reports']} missing, "
                f"{c['wrong']} wrong, {result['errors']} errors ({result['locked_errors']} locked)"
            )
            print(line)
    print(f"\nothers' CPU share during the run: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--trials-per-job", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--epoch-s", type=float, default=0.0, help="training time per epoch")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument(
        "--pg-user", default="postgres", help="user that runs PostgreSQL when run as root"
    )
    args = parser.parse_args()
    from bench.harness import OthersCpu, machine, publish

    quiet_optuna()
    at_start = machine()
    others = OthersCpu()
    own_before = time.process_time()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="furcate-optuna-storage-") as tmp:
        for jobs in args.jobs:
            by_kind: dict[str, Any] = {}
            for kind in args.candidates.split(","):
                folder = Path(tmp) / f"{jobs}-{kind}"
                try:
                    with target_of(kind, folder, args.pg_user) as target:
                        by_kind[kind] = run_candidate(
                            target, jobs, args.trials_per_job, args.epochs, args.epoch_s
                        )
                except (RuntimeError, ImportError, OSError) as exc:
                    if kind != "postgres":
                        raise
                    by_kind[kind] = {"skipped": f"{type(exc).__name__}: {exc}"}
                print(f"{jobs} jobs, {kind}: done", flush=True)
            anchor = by_kind["sqlite"]
            for result in by_kind.values():
                if "skipped" in result:
                    continue
                result["ops_ratio"] = round(result["job_ops_per_s"] / anchor["job_ops_per_s"], 2)
                result["median_ratio"] = {
                    name: round(op["median_ms"] / anchor["ops"][name]["median_ms"], 3)
                    for name, op in result["ops"].items()
                    if name in anchor["ops"]
                }
            runs[str(jobs)] = by_kind
    figures = {
        "epochs": args.epochs,
        "trials_per_job": args.trials_per_job,
        "epoch_s": args.epoch_s,
        "runs": runs,
        # this process's CPU only: the jobs, the proxy's threads' peers and PostgreSQL count
        # as others here
        "others_cpu_share": others.share(time.process_time() - own_before),
    }
    publish("optuna_storage", at_start, figures, show)


if __name__ == "__main__":
    main()
