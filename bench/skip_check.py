"""The skip check: 1,000 configs decided against a store holding 10,000 recorded job runs.

1,000 configs (600 drawn from the recorded ones, any status; 400 never recorded) against the
sqlite store of ``bench/store_fixture.py`` (10,000 job runs in 10 sweeps), with
``rerun=failed``:

  one call       ``RunStore.decide(fingerprints, Rerun.FAILED)`` for all 1,000 at once;
  launch chunks  ``decide`` as ``launch`` asks it: the idle slots first (2 here), then
                 LOOKUP_CHUNK configs per lookup;
  2 configs      one lookup of 2 configs (the async path's usual top-up);
  find_runs      the store's SELECT alone, without the decisions.

Anchors: one ``search_runs`` per config (what the single lookup replaces), timed on a sample
and extrapolated to 1,000; and, for context, the MLflow-server fallback (``search_runs`` paged
over the experiment's fingerprinted runs, filtered here). The goal is the whole check within
1 s, in one call and in ``launch``'s chunks. Each figure is the median of ``--repeats`` after
one warm-up call; the share of the CPU other processes used meanwhile is recorded.

Run: ``python bench/skip_check.py`` (~40 s; the first run also builds the store, ~10 s) writes
bench/results/skip_check.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import OthersCpu, machine, publish, summarize, timed
from bench.store_fixture import (
    EXPERIMENT,
    FixtureSpec,
    cached_fixture,
    check_fixture,
    query_fingerprints,
)
from furcate_hydra.launching.streaming import LOOKUP_CHUNK
from furcate_hydra.store import Action, Rerun, RunStore, Tags, TrackingUri
from furcate_hydra.store.lookup import _from_search, find_runs

GOAL_SKIP_CHECK_S = 1.0
# ``launch``'s first lookup covers the idle slots: 2 CPU slots, as in bench/recording.py.
FIRST_CHUNK = 2


def chunks(items: Sequence[str]) -> list[Sequence[str]]:
    """The launcher's lookups for one ``launch``: the idle slots first, then LOOKUP_CHUNK each."""
    size, out, start = FIRST_CHUNK, [], 0
    while start < len(items):
        out.append(items[start : start + size])
        start += size
        size = LOOKUP_CHUNK
    return out


def bench_skip_check(args: argparse.Namespace) -> dict[str, Any]:
    """Decide the configs against a copy of the cached store; then the anchors."""
    spec = FixtureSpec(runs=args.runs)
    cached, fixture = cached_fixture(spec)
    fps = query_fingerprints(spec, args.recorded, args.new)
    others, cpu = OthersCpu(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="furcate-bench-") as tmp:
        path = Path(tmp) / "mlflow.db"
        shutil.copyfile(cached, path)  # the cached file stays as built
        tracking = TrackingUri(f"sqlite:///{path}", "bench")
        store = RunStore(tracking, EXPERIMENT, 10.0, 60.0, sqlite_wal=True)
        client, experiment_id = store.client, store.experiment_id
        fixture["check"] = check_fixture(client, experiment_id, spec)

        first = time.perf_counter()
        decisions = store.decide(fps, Rerun.FAILED)  # the first call compiles the queries
        first_s = time.perf_counter() - first
        decide_s, _ = timed(lambda: store.decide(fps, Rerun.FAILED), args.repeats)
        chunked_s, _ = timed(
            lambda: [store.decide(c, Rerun.FAILED) for c in chunks(fps)], args.repeats
        )
        find_s, found = timed(lambda: find_runs(client, experiment_id, fps), args.repeats)
        two_s, _ = timed(lambda: store.decide(fps[:2], Rerun.FAILED), args.repeats)
        actions = {a.value: 0 for a in Action}
        for decision in decisions.values():
            actions[decision.action.value] += 1

        # Anchor: one search per config, timed on the first configs of the shuffled list.
        sample = fps[: args.naive_sample]

        def naive() -> None:
            for fp in sample:
                client.search_runs(
                    [experiment_id], filter_string=f"tags.`{Tags.FINGERPRINT}` = '{fp}'"
                )

        naive()  # warm-up
        naive_s, _ = timed(naive, 3)
        per_config = statistics.median(naive_s) / len(sample)

        # Context: what the lookup does against an MLflow server (no database to ask).
        wanted = set(fps)
        search_s, searched = timed(
            lambda: list(_from_search(client, experiment_id, wanted)), args.search_repeats
        )
        store.close()
    others_share = others.share(time.process_time() - cpu)
    decide_median = statistics.median(decide_s)
    chunked_median = statistics.median(chunked_s)
    naive_total = per_config * len(fps)
    return {
        "fixture": fixture,
        "others_cpu_share": others_share,
        "configs": {"checked": len(fps), "recorded": args.recorded, "new": args.new},
        "decisions": actions,
        "records_found": sum(len(v) for v in found.values()),
        "decide_one_call": {**summarize(decide_s), "first_call_ms": round(first_s * 1000, 1)},
        "decide_launcher_chunks": {
            **summarize(chunked_s),
            "chunks": len(chunks(fps)),
            "sizes": f"{FIRST_CHUNK}, then {LOOKUP_CHUNK} each",
        },
        "find_runs": summarize(find_s),
        "decide_2_configs": summarize(two_s),
        "naive_search_per_config": {
            "sample": len(sample),
            "per_config_ms": round(per_config * 1000, 2),
            "extrapolated_s": round(naive_total, 2),
            "over_decide": round(naive_total / decide_median, 1),
        },
        "server_fallback_search": {
            **summarize(search_s),
            "records_found": len(searched),
            "over_decide": round(statistics.median(search_s) / decide_median, 1),
        },
        "goal_s": GOAL_SKIP_CHECK_S,
        "goal_met": max(decide_median, chunked_median) <= GOAL_SKIP_CHECK_S,
    }


def print_skip(skip: dict[str, Any]) -> None:
    naive, search = skip["naive_search_per_config"], skip["server_fallback_search"]
    print(
        f"skip check, {skip['configs']['checked']} configs against "
        f"{skip['fixture']['job_runs']} runs: decisions {skip['decisions']}"
    )
    one, chunked = skip["decide_one_call"], skip["decide_launcher_chunks"]
    print(
        f"  RunStore.decide, one call       {one['median_ms']:8.1f} ms median (first call "
        f"{one['first_call_ms']:.1f} ms)"
    )
    print(f"  RunStore.decide, {chunked['chunks']} chunks      {chunked['median_ms']:8.1f} ms")
    print(f"  decide, 2 configs (one lookup)  {skip['decide_2_configs']['median_ms']:8.1f} ms")
    print(f"  find_runs                       {skip['find_runs']['median_ms']:8.1f} ms")
    print(
        f"  anchor: search_runs per config  {naive['extrapolated_s'] * 1000:8.0f} ms "
        f"({naive['per_config_ms']:.1f} ms x {skip['configs']['checked']}, "
        f"{naive['over_decide']} x decide)"
    )
    print(
        f"  server fallback (paged search)  {search['median_ms']:8.0f} ms "
        f"({search['over_decide']} x decide)"
    )
    print(f"  others' CPU share meanwhile     {skip['others_cpu_share']:8.1%}")
    verdict = "met" if skip["goal_met"] else "NOT met"
    print(f"goal: skip check <= {GOAL_SKIP_CHECK_S:.0f} s: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10_000, help="job runs in the store")
    parser.add_argument("--recorded", type=int, default=600, help="checked configs recorded")
    parser.add_argument("--new", type=int, default=400, help="checked configs never recorded")
    parser.add_argument("--repeats", type=int, default=7, help="repetitions of each lookup")
    parser.add_argument("--naive-sample", type=int, default=50, help="configs for the anchor")
    parser.add_argument("--search-repeats", type=int, default=2, help="server fallback repeats")
    args = parser.parse_args()
    at_start = machine()
    publish("skip_check", at_start, bench_skip_check(args), print_skip)


if __name__ == "__main__":
    main()
