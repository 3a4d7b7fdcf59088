"""What claiming configs costs the launcher: opening job runs with and without the claim check.

Opening a job's run, per job, in batches as the launcher opens them (2: the async path's usual
top-up and ``launch``'s first chunk on 2 slots; 64: ``LOOKUP_CHUNK``), into a fresh sqlite
store, uncontested (one launcher):

  claimed   ``RunStore.claim`` of the batch (a run each, one lookup of rivals) then
            ``RunStore.confirm`` of each (its params and the "won" mark in one ``log_batch``);
  anchor    what opening a run cost before claims: ``create_run`` with the job's tags, then a
            ``log_batch`` of its params, per job (the same MLflow calls, in this process).

Both paths take turns, batch after batch, on the same store, so a busy machine slows both
alike; wall and CPU time of this thread are reported per job (median over batches). The extra
lookup grows with the store rather than the batch: it is also timed against the skip check's
store of 10,000 recorded runs (``bench/store_fixture.py``), for 2 and 64 configs, next to the
skip/resume lookup (``RunStore.decide``) every batch already makes.

Run: ``python bench/claim_cost.py`` (~1 min; the first run also builds the 10,000-run store,
~10 s) writes bench/results/claim_cost.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import OthersCpu, machine, publish, summarize, timed
from bench.store_fixture import EXPERIMENT, FixtureSpec, cached_fixture, query_fingerprints
from furcate_hydra.launching.streaming import LOOKUP_CHUNK
from furcate_hydra.store import ClaimRequest, Rerun, RunStatus, RunStore, Tags, TrackingUri
from furcate_hydra.store.lookup import find_runs

BATCHES = (2, LOOKUP_CHUNK)
# the params of a small model/optim/data/trainer config, as flatten_params writes them
PARAMS = {f"group_{g}.key_{k}": str(g * k) for g in range(4) for k in range(4)}


def job_tags(fp: str, num: int) -> dict[str, str]:
    return {
        Tags.FINGERPRINT: fp,
        Tags.OVERRIDES: f"+x={num}",
        Tags.JOB_NUM: str(num),
        Tags.OUTPUT_DIR: f"/sweep/{num}",
        Tags.CHECKPOINT_DIR: f"/sweep/{num}/checkpoints",
    }


class Opener:
    """Opens batches of job runs on one store, both ways, with fresh fingerprints."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.count = 0

    def batch(self, size: int) -> list[tuple[str, dict[str, str]]]:
        jobs = [(f"fp-{self.count + i}", job_tags(f"fp-{self.count + i}", i)) for i in range(size)]
        self.count += size
        return jobs

    def claimed(self, size: int) -> None:
        requests = [ClaimRequest(fp, fp, tags, PARAMS) for fp, tags in self.batch(size)]
        for claim in self.store.claim(requests):
            assert claim.won
            self.store.confirm(claim)

    def anchor(self, size: int) -> None:
        from mlflow.entities import Param

        store, params = self.store, [Param(k, v) for k, v in PARAMS.items()]
        launcher = {**store.identity.tags(), Tags.PARENT_RUN: str(store.sweep_run_id)}
        for fp, tags in self.batch(size):
            run = store.client.create_run(
                store.experiment_id, run_name=fp, tags={**tags, **launcher}
            )
            store.client.log_batch(run.info.run_id, params=params)


def per_job(call: Callable[[int], None], size: int) -> tuple[float, float]:
    """Wall and CPU seconds per job of one batch."""
    wall, cpu = time.perf_counter(), time.thread_time()
    call(size)
    return (time.perf_counter() - wall) / size, (time.thread_time() - cpu) / size


def bench_opening(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        tracking = TrackingUri(f"sqlite:///{tmp}/mlflow.db", "bench")
        store = RunStore(tracking, "claims", 10.0, 60.0, sqlite_wal=True)
        store.start_sweep("sweep bench", {})
        opener = Opener(store)
        opener.claimed(2)  # warm-up: MLflow compiles its statements
        opener.anchor(2)
        for size in BATCHES:
            samples: dict[str, list[tuple[float, float]]] = {"claimed": [], "anchor": []}
            for turn in range(max(args.jobs // size, 3)):
                for name in ("claimed", "anchor") if turn % 2 else ("anchor", "claimed"):
                    samples[name].append(per_job(getattr(opener, name), size))
            row: dict[str, Any] = {
                name: {
                    "wall_ms_per_job": round(statistics.median(w for w, _ in s) * 1000, 2),
                    "cpu_ms_per_job": round(statistics.median(c for _, c in s) * 1000, 2),
                    "batches": len(s),
                }
                for name, s in samples.items()
            }
            for unit in ("wall_ms_per_job", "cpu_ms_per_job"):
                row[f"extra_{unit}"] = round(row["claimed"][unit] - row["anchor"][unit], 2)
            figures[f"batch_{size}"] = row
        store.finish_sweep(RunStatus.FINISHED)
        store.close()
    return figures


def bench_lookups(args: argparse.Namespace) -> dict[str, Any]:
    """The claim check's lookup against a big store, beside the lookup every batch makes."""
    spec = FixtureSpec(runs=10_000)
    cached, _ = cached_fixture(spec)
    fps = query_fingerprints(spec, 600, 400)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        path = Path(tmp) / "mlflow.db"
        shutil.copyfile(cached, path)
        store = RunStore(
            TrackingUri(f"sqlite:///{path}", "bench"), EXPERIMENT, 10.0, 60.0, sqlite_wal=True
        )
        client, experiment = store.client, store.experiment_id
        for size in BATCHES:
            batch = fps[:size]

            def decide(batch: list[str] = batch) -> object:
                return store.decide(batch, Rerun.FAILED)

            def check(batch: list[str] = batch) -> object:
                return find_runs(client, experiment, batch, running_only=True)

            decide(), check()  # warm-up
            decide_s, _ = timed(decide, args.repeats)
            check_s, _ = timed(check, args.repeats)
            figures[f"batch_{size}"] = {
                "decide_lookup": summarize(decide_s),
                "claim_check_lookup": summarize(check_s),
            }
        store.close()
    return figures


def show(figures: dict[str, Any]) -> None:
    print("opening job runs, fresh sqlite store, ms per job (median over batches):")
    for size in BATCHES:
        row = figures["opening"][f"batch_{size}"]
        claimed, anchor = row["claimed"], row["anchor"]
        print(
            f"  batches of {size:3d}: claimed {claimed['wall_ms_per_job']:6.2f} wall "
            f"{claimed['cpu_ms_per_job']:6.2f} CPU | anchor {anchor['wall_ms_per_job']:6.2f} "
            f"wall {anchor['cpu_ms_per_job']:6.2f} CPU | extra {row['extra_wall_ms_per_job']:+.2f}"
            f" wall {row['extra_cpu_ms_per_job']:+.2f} CPU"
        )
    print("lookups against the 10,000-run store, ms per batch (median):")
    for size in BATCHES:
        row = figures["lookups"][f"batch_{size}"]
        print(
            f"  {size:3d} configs: claim check {row['claim_check_lookup']['median_ms']:7.2f}"
            f" | skip/resume lookup (decide) {row['decide_lookup']['median_ms']:7.2f}"
        )
    print(f"others' CPU share meanwhile: {figures['others_cpu_share']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=768, help="jobs opened per path and batch")
    parser.add_argument("--repeats", type=int, default=9, help="repetitions of each lookup")
    args = parser.parse_args()
    at_start = machine()
    others, cpu = OthersCpu(), time.process_time()
    figures: dict[str, Any] = {"opening": bench_opening(args), "lookups": bench_lookups(args)}
    figures["others_cpu_share"] = others.share(time.process_time() - cpu)
    publish("claim_cost", at_start, figures, show)


if __name__ == "__main__":
    main()
