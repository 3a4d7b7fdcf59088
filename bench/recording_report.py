"""The recording benchmark's summary, printed report and profile tables (``bench/recording.py``)."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sysconfig
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["print_jobs", "profile_rows", "summary"]

_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_PROJECT = str(Path(__file__).resolve().parent.parent)


def summary(runs: Sequence[dict[str, Any]], paths: Sequence[str]) -> dict[str, Any]:
    """Per path: the best round with recording on and off (what the machine allows when it is
    fast), the median over rounds, on/off paired within each round, and what recording adds."""
    out: dict[str, Any] = {}
    for path in paths:
        on = [r for r in runs if r["path"] == path and r["recording"]]
        off = [r for r in runs if r["path"] == path and not r["recording"]]
        best_on = max(on, key=lambda r: r["jobs_per_s"])
        best_off = max(off, key=lambda r: r["jobs_per_s"])
        paired = [a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(on, off, strict=True)]
        out[path] = {
            "jobs_per_s_on": best_on["jobs_per_s"],
            "jobs_per_s_off": best_off["jobs_per_s"],
            "on_over_off": round(best_on["jobs_per_s"] / best_off["jobs_per_s"], 3),
            "median_jobs_per_s_on": round(statistics.median(r["jobs_per_s"] for r in on), 2),
            "median_jobs_per_s_off": round(statistics.median(r["jobs_per_s"] for r in off), 2),
            "on_over_off_by_round": [round(x, 3) for x in paired],
            "on_over_off_median": round(statistics.median(paired), 3),
            "wall_ms_per_job_on": best_on["wall_ms_per_job"],
            "wall_ms_per_job_off": best_off["wall_ms_per_job"],
            "recording_adds_wall_ms_per_job": round(
                best_on["wall_ms_per_job"] - best_off["wall_ms_per_job"], 2
            ),
            "recorder_ms_per_job_on": best_on["recorder_ms_per_job"],
            "recorder_ms_per_job_off": best_off["recorder_ms_per_job"],
            "recorder_adds_ms_per_job": round(
                best_on["recorder_ms_per_job"] - best_off["recorder_ms_per_job"], 2
            ),
            "launcher_busy_ms_per_job_on": best_on["launcher_busy_ms_per_job"],
            "launcher_busy_ms_per_job_off": best_off["launcher_busy_ms_per_job"],
            "all_jobs_per_s_on": [r["jobs_per_s"] for r in on],
            "all_jobs_per_s_off": [r["jobs_per_s"] for r in off],
        }
    return out


def print_jobs(jobs: dict[str, Any]) -> None:
    print(
        f"\n{'path':<8}{'on jobs/s':>11}{'off jobs/s':>12}{'on/off':>8}"
        f"{'median on/off, paired':>26}{'+wall ms/job':>14}{'recorder ms/job on/off':>24}"
    )
    for path, row in jobs["summary"].items():
        medians = (
            f"{row['median_jobs_per_s_on']:.2f}/{row['median_jobs_per_s_off']:.2f}, "
            f"{row['on_over_off_median']:.3f}"
        )
        print(
            f"{path:<8}{row['jobs_per_s_on']:>11.2f}{row['jobs_per_s_off']:>12.2f}"
            f"{row['on_over_off']:>8.3f}{medians:>26}"
            f"{row['recording_adds_wall_ms_per_job']:>14.1f}"
            f"{row['recorder_ms_per_job_on']:>14.1f} / {row['recorder_ms_per_job_off']:.1f}"
        )
    for run in jobs["runs"]:
        cpu = run["cpu_ms_per_job"]
        print(
            f"  round {run['round']} {run['path']:<7}{'on ' if run['recording'] else 'off'} "
            f"{run['jobs_per_s']:6.2f} jobs/s, launcher busy {run['launcher_busy_ms_per_job']:.0f}"
            f" ms/job, CPU ms/job launcher {cpu['launcher']:.0f} + server and jobs "
            f"{cpu['fork_server_and_jobs']:.0f}, slots busy {run['slot_busy_fraction']:.2f}, "
            f"fork to task {run['job_process']['fork_to_task']['median_ms']:.0f} ms, "
            f"context switches {run['launcher_context_switches_per_job']}, "
            f"probe {run['speed_probe']}"
        )
    for path in jobs["summary"]:
        best = max(
            (r for r in jobs["runs"] if r["path"] == path and r["recording"]),
            key=lambda r: r["jobs_per_s"],
        )
        parts = ", ".join(f"{k} {v:.1f}" for k, v in best["recorder_parts_ms_per_job"].items())
        print(f"\n{path}, recording on: recorder ms/job {parts}")
        print(f"  composition: {best['composition']}")
        print("  launcher-side ms per job: wall, CPU, outside timed calls")
        for label, timer in best["timers"].items():
            *parents, name = label.split(" / ")
            own = timer.get("self_ms_per_job")
            print(
                f"  {'  ' * len(parents)}{name:<34}{timer['ms_per_job']:>8.2f}"
                f"{timer['cpu_ms_per_job']:>8.2f}{'' if own is None else f'{own:>8.2f}'}"
            )
        if best["not_instrumented"]:
            print(f"  not instrumented: {', '.join(best['not_instrumented'])}")
    if "profile" in jobs:
        print("\nprofile, own time by package (ms/job):")
        for name, ms in jobs["profile"]["own_by_package"].items():
            print(f"  {name:<28}{ms:>8.2f}")
    goal = jobs["goal_jobs_per_s"]
    launch = jobs["summary"]["launch"]
    print(
        f"goal: >= {goal:.0f} jobs/s recorded (one launch, median round "
        f"{launch['median_jobs_per_s_on']:.2f}, best {launch['jobs_per_s_on']:.2f}): "
        f"{'met' if jobs['goal_met'] else 'NOT met'}"
    )


def _package(file: str, func: str) -> str:
    """Where a profiled function lives: a package, a stdlib module, or a C built-in."""
    if file == "~":
        for name in ("sqlite3", "pickle", "posix", "select", "json"):
            if name in func:
                return f"{name} (C)"
        return "other built-ins (C)"
    path = str(Path(file).resolve())
    if "site-packages" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if path.startswith(_PROJECT):
        return path[len(_PROJECT) + 1 :].split("/", 1)[0]
    if path.startswith(_STDLIB):
        return "stdlib " + path[len(_STDLIB) + 1 :].split("/", 1)[0].removesuffix(".py")
    return "other"


def profile_rows(profile: cProfile.Profile, jobs: int) -> dict[str, Any]:
    """The profile's top functions (cumulative and own time) and own time per package."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    by_package: dict[str, float] = defaultdict(float)
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (file, line, func), (_cc, calls, tottime, cumtime, _callers) in entries:
        by_package[_package(file, func)] += tottime
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})",
                "calls": calls,
                "tottime_ms_per_job": round(tottime * 1000 / jobs, 2),
                "cumtime_ms_per_job": round(cumtime * 1000 / jobs, 2),
            }
        )
    packages = sorted(by_package.items(), key=lambda item: item[1], reverse=True)
    return {
        "own_by_package": {name: round(s * 1000 / jobs, 2) for name, s in packages[:20]},
        "cumulative": sorted(rows, key=lambda r: r["cumtime_ms_per_job"], reverse=True)[:80],
        "own": sorted(rows, key=lambda r: r["tottime_ms_per_job"], reverse=True)[:40],
    }
