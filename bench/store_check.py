"""The store check: what refusing a damaged sqlite store costs at every launcher start.

``sqlite_damage`` (the sqlite header, then ``PRAGMA quick_check(1)`` on a read-only
connection) of the store of ``bench/store_fixture.py`` (10,000 job runs in 10 sweeps, each
with the launcher's tags, 16 params and 3 metrics), and of the same store with a metric
history (``--history`` values of each metric per run, as a run logging every epoch leaves),
against the launcher's normal store open in the same run:

  anchor      ``RunStore(...)`` as the launcher opens a store (MLflow's client and schema
              check, the experiment, WAL), with the damage check switched off
  check       ``sqlite_damage(path)``: what the launcher now adds before the open
  open        ``RunStore(...)`` with the check, as the launcher now opens a store
  *_lookup    anchor and open, each followed by a launch's first skip check (``decide`` of
              2 configs, which reads every fingerprint tag): on a cold store the check reads
              pages that lookup would read anyway, so this is what the check adds to a start
  integrity   ``PRAGMA integrity_check``, for comparison: what quick_check leaves out
              (indexes against their tables, UNIQUE) costs this much more

Each figure is taken on a fresh copy of the store (a new path: MLflow keeps one store object
per URI), the median of ``--repeats``, warm (the copy just written, in the page cache) and
cold (the copy evicted from the page cache first, as a store not read since a reboot). The
share of the CPU other processes used meanwhile is recorded.

Run: ``python bench/store_check.py`` (~5 min; the first run also builds the stores, ~2 min)
writes bench/results/store_check.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.harness import OthersCpu, machine, publish, summarize
from bench.store_fixture import EXPERIMENT, FixtureSpec, cached_fixture, query_fingerprints
from furcate_hydra.sqlite_health import sqlite_damage
from furcate_hydra.store import Rerun, RunStore, TrackingUri
from furcate_hydra.store import tracking_uri as tracking_uri_module

METRICS = ("train_loss", "val_loss", "val_acc")
# The first skip check of a launch covers its idle slots: 2 CPU slots, as in skip_check.py.
FIRST_LOOKUP = 2


def with_history(fixture: Path, steps: int) -> Path:
    """The fixture with ``steps`` values of each of its 3 metrics per job run (steps 0..),
    inserted straight into MLflow's ``metrics`` table; built once, kept beside the fixture."""
    path = fixture.with_name(f"{fixture.stem}-history{steps}.db")
    if path.exists():
        return path
    print(f"building the store with a metric history ({steps} steps), once", flush=True)
    partial = path.with_suffix(".partial")
    shutil.copyfile(fixture, partial)
    rng = random.Random(0)
    with sqlite3.connect(partial) as connection:
        runs = connection.execute(
            "SELECT run_uuid, start_time FROM runs WHERE run_uuid IN "
            "(SELECT run_uuid FROM params WHERE key = 'seed')"
        ).fetchall()
        rows = (
            (name, rng.random(), start + step * 1000, run_id, step, 0)
            for run_id, start in runs
            for name in METRICS
            for step in range(steps)
        )
        connection.executemany(
            "INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    connection.close()
    partial.rename(path)
    return path


@contextmanager
def fresh_copy(source: Path, folder: Path, cold: bool) -> Iterator[Path]:
    """A copy of ``source`` at a new path; ``cold``: written to disk and dropped from the
    page cache, so reading it costs what reading a store not touched for a while costs."""
    path = folder / f"{time.monotonic_ns()}" / "mlflow.db"
    path.parent.mkdir()
    shutil.copyfile(source, path)
    if cold:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        yield path
    finally:
        shutil.rmtree(path.parent)


def open_store(path: Path, lookup: Sequence[str] = ()) -> None:
    """The launcher's store open; with ``lookup``, then its first skip check of a launch."""
    store = RunStore(
        TrackingUri(f"sqlite:///{path}", "bench"), EXPERIMENT, 10.0, 60.0, sqlite_wal=True
    )
    if lookup:
        store.decide(lookup, Rerun.FAILED)
    store.close()


def integrity_check(path: Path) -> None:
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        rows = connection.execute("PRAGMA integrity_check").fetchall()
    finally:
        connection.close()
    assert rows == [("ok",)], rows


def check(path: Path) -> None:
    assert sqlite_damage(path) is None


@contextmanager
def check_off() -> Iterator[None]:
    """The launcher's open as it was before the check: the damage check finds nothing."""
    real = getattr(tracking_uri_module, "sqlite_damage")  # noqa: B009 (not exported)
    setattr(tracking_uri_module, "sqlite_damage", lambda path: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(tracking_uri_module, "sqlite_damage", real)  # noqa: B010


def anchor(path: Path, lookup: Sequence[str] = ()) -> None:
    with check_off():
        open_store(path, lookup)


def time_on_copies(
    call: Callable[[Path], None], source: Path, folder: Path, cold: bool, repeats: int
) -> list[float]:
    seconds = []
    for _ in range(repeats):
        with fresh_copy(source, folder, cold) as path:
            began = time.perf_counter()
            call(path)
            seconds.append(time.perf_counter() - began)
    return seconds


def bench_store(source: Path, repeats: int, lookup: Sequence[str]) -> dict[str, Any]:
    """Every measure on ``source``, warm then cold, interleaved copy by copy."""
    out: dict[str, Any] = {"size_mib": round(source.stat().st_size / 2**20, 1), "rows": {}}
    with sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True) as connection:
        for table in ("runs", "tags", "params", "metrics", "latest_metrics"):
            out["rows"][table] = connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    connection.close()
    calls: dict[str, Callable[[Path], None]] = {
        "anchor": anchor,
        "check": check,
        "open": open_store,
        "anchor_lookup": lambda path: anchor(path, lookup),
        "open_lookup": lambda path: open_store(path, lookup),
        "integrity": integrity_check,
    }
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        folder = Path(tmp)
        with fresh_copy(source, folder, cold=False) as path:
            open_store(path)  # warm-up: MLflow's lazy imports
        for cache in ("warm", "cold"):
            figures: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(repeats):  # interleaved, so drift hits every measure alike
                for name, call in calls.items():
                    figures[name] += time_on_copies(call, source, folder, cache == "cold", 1)
            anchor_median = statistics.median(figures["anchor"])
            out[cache] = {
                name: {
                    **summarize(seconds),
                    "over_anchor": round(statistics.median(seconds) / anchor_median, 3),
                }
                for name, seconds in figures.items()
            }
            check_ms = out[cache]["check"]["median_ms"]
            out[cache]["check"]["ms_per_mib"] = round(check_ms / out["size_mib"], 2)
            added = (
                out[cache]["open_lookup"]["median_ms"] - out[cache]["anchor_lookup"]["median_ms"]
            )
            out[cache]["check_added_to_open_and_lookup_ms"] = round(added, 1)
    return out


def bench_store_check(args: argparse.Namespace) -> dict[str, Any]:
    spec = FixtureSpec(runs=args.runs)
    fixture, info = cached_fixture(spec)
    stores = {"fixture": (fixture, args.repeats)}
    if args.history:
        history = with_history(fixture, args.history)
        stores[f"history{args.history}"] = (history, args.history_repeats)
    lookup = query_fingerprints(spec, FIRST_LOOKUP // 2, FIRST_LOOKUP - FIRST_LOOKUP // 2)
    others, cpu = OthersCpu(), time.process_time()
    results = {}
    for name, (path, repeats) in stores.items():
        print(f"timing store {name}, {repeats} copies per measure", flush=True)
        results[name] = bench_store(path, repeats, lookup)
    return {
        "fixture": {k: v for k, v in info.items() if k != "cached"},
        "stores": results,
        "others_cpu_share": others.share(time.process_time() - cpu),
    }


def print_store_check(figures: dict[str, Any]) -> None:
    for name, store in figures["stores"].items():
        rows = ", ".join(f"{k} {v}" for k, v in store["rows"].items())
        print(f"store {name}: {store['size_mib']} MiB ({rows})")
        for cache in ("warm", "cold"):
            for measure, value in store[cache].items():
                if not isinstance(value, dict):
                    print(f"  {cache} {measure}: {value}")
                    continue
                print(
                    f"  {cache} {measure:10s} {value['median_ms']:8.1f} ms median "
                    f"(p90 {value['p90_ms']:.1f}) = {value['over_anchor']:.3f} x anchor"
                )
    print(f"others' CPU share meanwhile {figures['others_cpu_share']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10_000, help="job runs in the store")
    parser.add_argument(
        "--history", type=int, default=30, help="values per metric per run (0: no such store)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="copies timed per measure")
    parser.add_argument(
        "--history-repeats", type=int, default=3, help="copies timed per measure, history store"
    )
    args = parser.parse_args()
    at_start = machine()
    publish("store_check", at_start, bench_store_check(args), print_store_check)


if __name__ == "__main__":
    main()
