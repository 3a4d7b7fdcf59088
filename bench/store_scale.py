"""A year of sweeps in one store: furcate's store calls against 10k, 100k and 1M recorded runs.

Stores of ``bench/store_fixture.py`` (sweeps of 10,000 job runs each), as sqlite files and as
PostgreSQL databases of a server the bench starts on loopback (``bench/postgres.py``), read
directly (``postgresql://``) and through an ``mlflow server`` in front of the same database.
Each store is a copy of the cached fixture (a file copy; ``CREATE DATABASE ... TEMPLATE``),
measured without furcate's indexes (MLflow's schema as MLflow makes it), then after
``furcate index`` (``furcate_hydra/store/store_index.py``). Per store:

  skip check   ``RunStore.decide`` of a 10k-config sweep (6,000 recorded configs, 4,000 new);
               on sqlite also ``SqliteReader.decide`` (a rerun's check before MLflow loads)
  job          a claim and a record per job: ``claim`` of 2 configs, ``confirm`` of each,
               ``finish_job_run`` FINISHED with a return value (ms per job, median of batches)
  start        the launcher's store start: ``RunStore`` opened, ``end_orphaned_sweeps``,
               ``start_sweep``
  status       ``SweepReader(...).snapshot()`` of a sweep of 10,000 job runs (its pointer file
               in a temp sweep dir, no job dirs: the store's part of ``furcate status``)
  ls           ``list_sweeps``: the newest 20 sweeps with their counts (``furcate ls``)
  ui sweep     ``mlflow ui``'s runs page of one sweep: its ``search_runs`` (parent run filter,
               newest first, 100 runs)

Each figure sits beside the same figure at 10k runs of the same backend in the same run. Goals:
skip check <= 2 s, status <= 1 s, per-job cost at 1M <= 1.2 x at 10k. Through an MLflow server
the skip check pages through every fingerprinted run of the experiment (no SQL to ask): above
10k runs it is timed on its first page and extrapolated over the pages (marked so).

Run: ``python bench/store_scale.py`` (the first run builds the fixtures: ~15 min for 1M runs
in sqlite, as long again in PostgreSQL; then ~30 min) writes bench/results/store_scale.json;
``--sizes 10000 100000 --backends sqlite`` for a quick look.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.claim_cost import job_tags
from bench.harness import RESULTS_DIR, OthersCpu, machine, publish
from bench.postgres import Cluster, mlflow_server
from bench.store_fixture import (
    EXPERIMENT,
    FixtureSpec,
    cached_fixture,
    cached_postgres_fixture,
    check_fixture,
    query_fingerprints,
)
from furcate_hydra.store import ClaimRequest, RunStatus, RunStore, Tags, TrackingUri
from furcate_hydra.store.decisions import Rerun
from furcate_hydra.store.index_command import run_index
from furcate_hydra.store.liveness import LauncherIdentity
from furcate_hydra.store.lookup import _search
from furcate_hydra.store.sqlite_reader import SqliteReader
from furcate_hydra.store.sweep_list import list_sweeps
from furcate_hydra.store.sweep_pointer import SweepPointer
from furcate_hydra.store.sweep_reader import SweepReader

BACKENDS = ("sqlite", "postgres", "server")
GOALS = {"skip_check_s": 2.0, "status_s": 1.0, "job_ratio_at_1m": 1.2}
PARAMS = {f"group_{g}.key_{k}": str(g * k) for g in range(4) for k in range(4)}
JOBS_PER_SIZE = 40
BENCH_SWEEP = "sweep bench"


def spec_for(runs: int) -> FixtureSpec:
    return FixtureSpec(runs=runs, sweeps=max(runs // 10_000, 1))


def clock(call: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """Median wall seconds of ``repeats`` calls after one warm-up (one call only when the
    warm-up took over 20 s)."""
    began = time.perf_counter()
    value = call()
    first = time.perf_counter() - began
    seconds = [first]
    if first < 20:
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            value = call()
            seconds.append(time.perf_counter() - began)
    return {"s": round(statistics.median(seconds), 4), "n": len(seconds), "value": value}


def open_store(uri: str) -> RunStore:
    return RunStore(TrackingUri(uri, "bench"), EXPERIMENT, 10.0, 60.0, sqlite_wal=True)


def measure(uri: str, spec: FixtureSpec, tmp: Path, server: bool) -> dict[str, Any]:
    """Every figure against the store at ``uri``."""
    figures: dict[str, Any] = {}
    fps = query_fingerprints(spec, 6000, 4000)
    store = open_store(uri)
    client, experiment = store.client, store.experiment_id
    sweeps = client.search_runs(
        [experiment], f"tags.`{Tags.ROLE}` = 'sweep'", order_by=["attributes.start_time DESC"]
    )
    # a sweep of the fixture's (not one this bench started), from the middle of the store
    recorded = [run for run in sweeps if run.info.run_name != BENCH_SWEEP]
    sweep_id = recorded[len(recorded) // 2].info.run_id
    figures["fixture_check"] = check_fixture(client, experiment, spec)["valid"]
    if not server:
        skip = clock(lambda: store.decide(fps, Rerun.FAILED), 3)
        figures["skip_check_s"] = skip["s"]
    else:
        # the server fallback: every fingerprinted run of the experiment, page by page
        condition = f"tags.`{Tags.FINGERPRINT}` LIKE '%'"
        if spec.runs <= 10_000:
            figures["skip_check_s"] = clock(lambda: store.decide(fps, Rerun.FAILED), 1)["s"]
        else:
            page = clock(lambda: next(iter(_search(client, experiment, condition))), 1)
            # the first run of the first page arrives with the whole page (10,000 runs)
            figures["skip_check_s"] = round(page["s"] * spec.runs / 10_000, 1)
            figures["skip_check_extrapolated_from_s"] = page["s"]
    path = TrackingUri(uri, "bench").sqlite_path
    if path is not None:
        reader = SqliteReader(path, EXPERIMENT)
        here = LauncherIdentity.current()
        figures["skip_check_sqlite_reader_s"] = clock(
            lambda: reader.decide(fps, Rerun.FAILED, None, here, 60.0), 3
        )["s"]
    figures["ui_sweep_page_s"] = clock(
        lambda: client.search_runs(
            [experiment],
            f"tags.`{Tags.PARENT_RUN}` = '{sweep_id}'",
            order_by=["attributes.start_time DESC"],
            max_results=100,
        ),
        3,
    )["s"]
    figures["ls_s"] = clock(lambda: list_sweeps(client, [], 20), 3)["s"]
    sweep_dir = tmp / "sweep"
    sweep_dir.mkdir(exist_ok=True)
    pointer = SweepPointer(uri, experiment, EXPERIMENT, sweep_id, 1.78e9, 60.0)
    pointer.write(sweep_dir / "furcate_sweep.json")
    status = clock(lambda: len(SweepReader(sweep_dir).snapshot().jobs), 1)
    figures["status_s"], figures["status_jobs"] = status["s"], status["value"]
    store.close()

    def start() -> RunStore:
        opened = open_store(uri)
        opened.end_orphaned_sweeps()
        opened.start_sweep(BENCH_SWEEP, {Tags.SWEEP_DIR: str(sweep_dir)})
        return opened

    began = time.perf_counter()
    started = start()  # once: a started sweep beats until it finishes
    figures["launcher_start_s"] = round(time.perf_counter() - began, 4)
    try:
        figures["job_ms"] = per_job(started, JOBS_PER_SIZE)
    finally:
        started.finish_sweep(RunStatus.FINISHED)
        started.close()
    return figures


def plans(uri: str, cluster: Cluster | None, database: str) -> dict[str, str]:
    """The database's plan for the skip check's SELECT and the runs of one sweep (PostgreSQL:
    EXPLAIN ANALYZE, run for real; sqlite: EXPLAIN QUERY PLAN)."""
    queries = {
        "skip_check_chunk": (
            "SELECT r.run_uuid, t.key, t.value FROM runs r JOIN tags fp ON fp.run_uuid = "
            f"r.run_uuid AND fp.key = '{Tags.FINGERPRINT}' JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE r.experiment_id = 1 AND r.lifecycle_stage = 'active' AND fp.value IN "
            f"('{'0' * 64}', '{'1' * 64}') AND (t.key LIKE 'furcate.%' OR t.key = "
            f"'{Tags.PARENT_RUN}')"
        ),
        "one_sweep": f"SELECT run_uuid FROM tags WHERE key = '{Tags.PARENT_RUN}' AND value = 'x'",
    }
    path = TrackingUri(uri, "bench").sqlite_path
    if path is not None:
        with sqlite3.connect(path) as connection:
            return {
                name: "; ".join(row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {sql}"))
                for name, sql in queries.items()
            }
    assert cluster is not None
    return {
        name: cluster.psql(database, f"EXPLAIN (ANALYZE, COSTS OFF) {sql}")
        for name, sql in queries.items()
    }


def per_job(store: RunStore, jobs: int) -> float:
    """A claim and a record per job, in batches of 2: median ms per job over the batches."""
    seconds = []
    base = time.time_ns()
    for batch in range(jobs // 2):
        requests = [
            ClaimRequest(f"fp-{base}-{n}", f"job {n}", job_tags(f"fp-{base}-{n}", n), PARAMS)
            for n in (2 * batch, 2 * batch + 1)
        ]
        began = time.perf_counter()
        for claim in store.claim(requests):
            run_id = store.confirm(claim)
            store.finish_job_run(run_id, RunStatus.FINISHED, return_value={"val_loss": 0.5})
        seconds.append((time.perf_counter() - began) / 2)
    return round(statistics.median(seconds[1:]) * 1000, 2)


@contextlib.contextmanager
def store_copies(backend: str, runs: int, tmp: Path, cluster: Cluster | None) -> Iterator[str]:
    """A copy of the cached fixture of ``runs`` runs, as the backend reaches it."""
    spec = spec_for(runs)
    if backend == "sqlite":
        cached, _ = cached_fixture(spec)
        path = tmp / f"copy-{runs}.db"
        shutil.copyfile(cached, path)
        settle(None)
        try:
            yield f"sqlite:///{path}"
        finally:
            path.unlink()
        return
    assert cluster is not None
    template, _ = cached_postgres_fixture(spec, cluster)
    name = f"copy_{runs}"
    cluster.psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    cluster.psql("postgres", f"CREATE DATABASE {name} TEMPLATE {template}")
    settle(cluster)
    try:
        if backend == "postgres":
            yield cluster.url(name)
        else:
            log = tmp / f"server-{runs}.log"
            with mlflow_server(cluster.url(name), tmp / "artifacts", log) as address:
                yield address
    finally:
        # the bench's own MLflow clients keep their connections open
        cluster.psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def settle(cluster: Cluster | None) -> None:
    """Write out what copying a store and building its index left dirty (GBs at 1M runs):
    otherwise the per-job figure times the kernel's writeback in each job's fsync."""
    if cluster is not None and cluster.port:
        cluster.psql("postgres", "CHECKPOINT")
    os.sync()


def direct_uri(backend: str, uri: str, cluster: Cluster | None, runs: int) -> str:
    """The database behind ``uri``: furcate index runs against it."""
    if backend == "server":
        assert cluster is not None
        return cluster.url(f"copy_{runs}")
    return uri


def bench(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="furcate-scale-")))
        cluster = None
        if any(b != "sqlite" for b in args.backends):
            cluster = Cluster(RESULTS_DIR / "postgres")
            stack.enter_context(cluster.running())
        for backend in args.backends:
            by_size: dict[str, Any] = {}
            for runs in args.sizes:
                print(f"{backend}, {runs} runs", flush=True)
                with store_copies(backend, runs, tmp, cluster) as uri:
                    server = backend == "server"
                    database = direct_uri(backend, uri, cluster, runs)
                    row: dict[str, Any] = {"plain": measure(uri, spec_for(runs), tmp, server)}
                    row["plain_plans"] = plans(database, cluster, f"copy_{runs}")
                    began = time.perf_counter()
                    made = run_index(TrackingUri(database, "bench"))
                    row["index_build_s"] = round(time.perf_counter() - began, 2)
                    settle(cluster)
                    row["index"] = made
                    row["indexed"] = measure(uri, spec_for(runs), tmp, server)
                    row["indexed_plans"] = plans(database, cluster, f"copy_{runs}")
                by_size[str(runs)] = row
                print(f"  {row['plain']}\n  {row['indexed']}", flush=True)
            results[backend] = by_size
    return results


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each figure over the same figure at the smallest store of its backend."""
    out: dict[str, Any] = {}
    for backend, by_size in results.items():
        anchor_size = min(by_size, key=int)
        for size, row in by_size.items():
            for variant in ("plain", "indexed"):
                anchor = by_size[anchor_size][variant]
                out.setdefault(backend, {}).setdefault(size, {})[variant] = {
                    name: round(value / anchor[name], 2)
                    for name, value in row[variant].items()
                    if isinstance(value, float) and anchor.get(name)
                }
    return out


def show(figures: dict[str, Any]) -> None:
    names = ("skip_check_s", "job_ms", "launcher_start_s", "status_s", "ls_s", "ui_sweep_page_s")
    print("| backend | runs | variant | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for backend, by_size in figures["runs"].items():
        for size, row in by_size.items():
            for variant in ("plain", "indexed"):
                cells = []
                for name in names:
                    value = row[variant][name]
                    ratio = figures["ratios"][backend][size][variant].get(name)
                    cells.append(f"{value} ({ratio}x)" if ratio is not None else str(value))
                print(f"| {backend} | {size} | {variant} | " + " | ".join(cells) + " |")
    print(f"others' CPU share: {figures['others_cpu_share']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    args = parser.parse_args()
    at_start = machine()
    others, cpu = OthersCpu(), time.process_time()
    runs = bench(args)
    figures = {
        "runs": runs,
        "ratios": ratios(runs),
        "goals": GOALS,
        "others_cpu_share": others.share(time.process_time() - cpu),
    }
    # one file per set of backends: a run of one backend keeps the others' figures
    name = "_".join(
        ["store_scale", *([] if set(args.backends) == set(BACKENDS) else args.backends)]
    )
    publish(name, at_start, figures, show)


if __name__ == "__main__":
    main()
