"""Small training jobs packed onto one GPU: the aggregate rate per jobs per GPU, MPS off and on,
what ``jobs_per_gpu=auto`` learns, and whether a model that outgrows the GPU loses jobs.

Each case is a real sweep through the Hydra CLI, a fresh interpreter and sweep dir:

    python bench/apps/gpu_train_app.py -m model=M seed=range(0,N) train_seconds=T
        hydra/launcher=furcate hydra.launcher.gpus=[0] hydra.launcher.jobs_per_gpu=K
        hydra.launcher.mps=off|on hydra.launcher.mlflow.enabled=false +stop_at=... ...

Recording is off: what is measured is the packing, and MLflow's import and runs would add ~2 s
to every case. Models (``bench/apps/gpu_train_app.py``): ``mlp`` (batches of 512) and ``cnn``
(batches of 256 images of 3x32x32), each leaving an H100 mostly idle alone; ``oom``, the MLP that
takes 1/6 of the GPU's memory 60 % into its training (5 fit, 8 do not).

Cases, in the order they run, so that a run cut short keeps the figures that matter most:

    1/GPU anchors (MPS off) of each model  ─►  mlp auto  ─►  mlp at the biggest count, MPS
    off and on  ─►  oom at 8 per GPU  ─►  mlp at 8, MPS off and on  ─►  oom at auto  ─►  the
    mlp's other counts  ─►  the cnn's auto, its counts  ─►  1/GPU with MPS on (its own cost)

A fixed count K runs K jobs (one wave) that meet at a barrier after their first step and then
train T = 3 s, all at once. An auto case runs 64 jobs of 10 s: auto starts at one job and opens
one slot at a time while the measured rate grows, ~4-5 s a step, so its jobs must outlast the
climb; its jobs stop at the case's deadline (60 s), and any job still queued then returns at
once ("cut"). The oom cases run 8 (at auto 12) jobs of 4 s (6 s).

Figures per case (JSON and a markdown table, rewritten after every case). Every job counts
its samples in 0.25 s wall-clock buckets; added up over the jobs, each bucket through which n
jobs trained (none starting or ending in it) gives the GPU's aggregate rate with n jobs:

  samples/s (n)     the mean of those rates at the case's count: a fixed count K with all
                    K training; auto at the count it settled on (gpu_packing.json); the
                    rates at every n are in the JSON (``rate_by_jobs``: auto's climb)
  x 1/GPU           that over the same model's 1 job per GPU, MPS off, in the same run
  best 2 s          the best 2 s of aggregate rate, whatever ran then
  timed samples/s   the sum of the jobs' own rates over their timed seconds (fixed counts:
                    after the barrier, every job beside all the others)
  NVML peak         per job the highest gpu_mem_mb of its trace.csv (its CUDA context
                    included), median over jobs, beside max_memory_reserved (torch's)
  at a time         the most jobs running at once, by their tasks' own clocks
  jobs              done / FAILED / cut by the deadline; OOM attempts and the GPU's back-offs
For auto: the count it learned and why it stopped (gpu_packing.json), its rate over the best
fixed count's and over 1/GPU; MPS on over off per count; the goals set for the GPU path. The
GPU (nvidia-smi: name, driver, memory), torch and its CUDA are recorded.

What fits: on an H200 a sweep of 2 waves of 3-4 s jobs took 32-56 s; these cases take ~12-20 s
(a fixed count: ~5 s the sweep's start, 2-6 s the jobs' CUDA start-up, 3 s timed, ~2 s exit),
~65 s (auto) and ~20-45 s (oom): all 20 cases ~8 min. The ~3-3.5 min the GPU session leaves
after its tests run the first ~7 (both anchors, mlp auto, mlp 32 off and on, oom at 8, mlp 8
off and on). Where the launcher has no ``hydra.launcher.mps`` option, the MPS-on cases are
left out (and said so).

Run: ``python bench/gpu_packing.py --out DIR`` (``--budget-s``: no case starts that could not
end within it, default 300; 600 runs all 20); ``--cpu-dry-run`` proves the harness without a
GPU: CPU slots (``gpus=[]``, ``max_workers`` for the count), tiny models, 2 s jobs (~1.5 min on
2 cores). Writes gpu_packing_bench.json and .md to DIR (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from bench.commands import app_command, run_command
from bench.harness import RESULTS_DIR, machine
from bench.sweep_reading import (
    at_a_time,
    max_over_gpus,
    packed_rate,
    rates_by_jobs,
    read_attempts,
    read_job_runs,
    read_packing,
    trace_peak_mib,
)

APP = Path(__file__).resolve().parent / "apps" / "gpu_train_app.py"
NAME = "gpu_packing_bench"
TRACE_S = 1.0  # each job's trace.csv, for its NVML peak; auto samples on its own
WINDOW_S = 2.0  # the packed rate's window
MIN_BUCKETS = 4  # a count's rate needs this many buckets (1 s) with that many jobs training
DRAIN_S = 20.0  # after a case's deadline: jobs stop, queued ones return, the launcher exits
OLD_CAP = 8  # the max_jobs_per_gpu default before it became null (the cores decide)


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("mlp", "cnn")
    counts: tuple[int, ...] = (1, 8, 16, 32)
    mps: tuple[str, ...] = ("off", "on")
    auto: bool = True
    oom: bool = True
    train_seconds: float = 3.0
    case_s: float = 45.0  # a fixed or oom case's deadline
    min_case_s: float = 20.0  # no fixed or oom case starts with less budget than this left
    auto_jobs: int = 64
    auto_train_seconds: float = 10.0
    auto_case_s: float = 60.0
    min_auto_s: float = 40.0
    oom_per_gpu: int = 8  # the oom model's block is sized so that this many cannot fit
    oom_train_seconds: float = 4.0
    budget_s: float = 300.0
    warm_up: bool = True
    gpu: str = "0"
    dry: bool = False
    # whether this launcher has hydra.launcher.mps; without it only the MPS-off cases run
    mps_option: bool = True


DRY = Settings(
    counts=(1, 2),
    mps=("off",),
    train_seconds=2.0,
    case_s=30.0,
    min_case_s=8.0,
    auto_jobs=6,
    auto_train_seconds=1.5,
    auto_case_s=30.0,
    min_auto_s=15.0,
    oom_per_gpu=2,
    oom_train_seconds=1.5,
    budget_s=300.0,
    warm_up=False,
    dry=True,
)


@dataclass(frozen=True)
class Case:
    """One sweep: ``jobs`` jobs of ``model`` at ``per_gpu`` jobs per GPU ("1", ... or "auto")
    with MPS ``mps``, each training ``train_s``, all stopped ``limit_s`` after its start."""

    model: str
    per_gpu: str
    mps: str
    jobs: int
    train_s: float
    limit_s: float
    min_s: float

    @property
    def name(self) -> str:
        return f"{self.model}-{self.per_gpu}-per-gpu-mps-{self.mps}"

    @property
    def barrier(self) -> int:
        """Jobs that meet before their timed seconds: a fixed count's one wave of them."""
        one_wave = self.model != "oom" and self.per_gpu.isdigit()
        return int(self.per_gpu) if one_wave and int(self.per_gpu) > 1 else 0


def plan(s: Settings) -> list[Case]:
    """The cases by priority: the anchors first, then auto and the biggest counts."""
    first, *others = s.models
    top, middle = max(s.counts), sorted(k for k in s.counts if k not in (1, max(s.counts)))

    def fixed(model: str, k: int, mps: str) -> Case:
        return Case(model, str(k), mps, k, s.train_seconds, s.case_s, s.min_case_s)

    def auto(model: str) -> list[Case]:
        jobs, train = s.auto_jobs, s.auto_train_seconds
        return [Case(model, "auto", "auto", jobs, train, s.auto_case_s, s.min_auto_s)] * s.auto

    def counts(model: str, ks: list[int]) -> list[Case]:
        return [fixed(model, k, m) for k in ks for m in s.mps]

    cases = [fixed(model, 1, "off") for model in s.models if 1 in s.counts]
    cases += auto(first) + counts(first, [top])
    oom_fixed: list[Case] = []
    oom_auto: list[Case] = []
    if s.oom:
        k, train = s.oom_per_gpu, s.oom_train_seconds
        oom_fixed = [Case("oom", str(k), "off", k, train, s.case_s, s.min_case_s)]
        jobs, train = round(1.5 * k), 1.5 * s.oom_train_seconds
        oom_auto = [Case("oom", "auto", "auto", jobs, train, s.case_s, s.min_case_s)] * s.auto
    # the smallest middle count (8: MPS on against off there is a goal) before the oom auto
    cases += oom_fixed + counts(first, middle[:1]) + oom_auto + counts(first, middle[1:])
    for model in others:
        cases += auto(model) + counts(model, [top]) + counts(model, middle)
    if 1 in s.counts:  # MPS's own cost on one job: least needed, last
        cases += [fixed(model, 1, m) for model in s.models for m in s.mps[1:]]
    return cases


def overrides(case: Case, s: Settings, where: Path, stop_at: float) -> list[str]:
    args = [
        f"model={case.model}",
        f"seed=range(0,{case.jobs})",
        f"train_seconds={case.train_s}",
        "hydra/launcher=furcate",
        f"hydra.sweep.dir={where / 'sweep'}",
        "hydra.launcher.mlflow.enabled=false",
        f"hydra.launcher.trace_interval_s={TRACE_S}",
        "hydra.launcher.echo_output=false",
        "hydra.launcher.progress=plain",
        f"+stop_at={stop_at:.3f}",
    ]
    if case.barrier:
        args += [f"+barrier={case.barrier}", f"+barrier_dir={where / 'barrier'}"]
    if case.model == "oom":  # its memory grows 60 % into its training (see the app)
        args.append(f"oom_after_s={0.6 * case.train_s:g}")
    top = max(s.counts)
    if s.dry:
        count = top if case.per_gpu == "auto" else int(case.per_gpu)
        return [*args, "tiny=true", "hydra.launcher.gpus=[]", f"hydra.launcher.max_workers={count}"]
    args += [f"hydra.launcher.gpus=[{s.gpu}]", f"hydra.launcher.jobs_per_gpu={case.per_gpu}"]
    if s.mps_option:
        args.append(f"hydra.launcher.mps={case.mps}")
    cap = launcher_default("max_jobs_per_gpu", None)
    if case.per_gpu == "auto" and cap is not None and cap < top:
        args.append(f"hydra.launcher.max_jobs_per_gpu={top}")  # the old cap of 8 would decide
    elif case.per_gpu.isdigit() and int(case.per_gpu) > OLD_CAP:
        args.append(f"hydra.launcher.max_jobs_per_gpu={case.per_gpu}")
    return args


def run_case(case: Case, s: Settings, root: Path, left_s: float) -> dict[str, Any]:
    """Run one sweep through the CLI, stopped by ``left_s`` at the latest; read what it left."""
    where = root / case.name
    where.mkdir(parents=True)
    limit = max(1.0, min(case.limit_s, left_s - DRAIN_S))
    command = app_command(APP, overrides(case, s, where, time.time() + limit))
    log = where / "command.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # past its deadline and the drain the sweep is stopped as a user would (Ctrl-C: the
    # launcher stops its jobs and its MPS daemon); a Ctrl-C of the bench stops it the same way
    done = run_command(
        command, cwd=where, env=env, timeout_s=limit + DRAIN_S, log=log, own_session=True
    )
    figures: dict[str, Any] = {
        "case": asdict(case) | {"barrier": case.barrier},
        "command": command[1:],
        "returncode": done.returncode,
        "timed_out": done.returncode is None,
        "wall_s": round(done.ended - done.began, 2),
        **read_case(where / "sweep", case),
    }
    if done.returncode != 0:
        figures["log_tail"] = log.read_text(errors="replace")[-4000:]
    return figures


def read_case(sweep_dir: Path, case: Case) -> dict[str, Any]:
    """A sweep's figures: its jobs, their samples and memory, the packing."""
    runs = read_job_runs(sweep_dir)
    jobs: list[dict[str, Any]] = []
    buckets: list[dict[str, int]] = []
    bucket_s = 0.25
    # jobs running at once by their tasks' own clocks: run_data.csv's end is when the launcher
    # took the job's end in, a few ms after the next job on its slot began
    attempts_at: list[tuple[float, float]] = []
    for run in runs:
        path = run.output_dir / "bench.json"
        info = json.loads(path.read_text()) if path.exists() else {}
        attempts = read_attempts(run.output_dir)
        attempts_at += [(a.started_at, a.ended_at) for a in attempts]
        buckets.append(info.get("buckets", {}))
        bucket_s = info.get("bucket_s", bucket_s)
        jobs.append(
            {
                "num": run.num,
                "status": run.status,
                "cut": bool(info.get("cut")),
                "samples": info.get("samples"),
                "samples_per_s": info.get("samples_per_s"),
                "barrier_met": info.get("barrier_met"),
                "nvml_peak_mib": trace_peak_mib(run.output_dir),
                "max_memory_reserved_mib": info.get("max_memory_reserved_mib"),
                "block_mib": info.get("block_mib"),
                "attempts": len(attempts),
                "oom_attempts": sum(a.outcome == "oom" for a in attempts),
                "device": info.get("device"),
                "mps_pipe_directory": info.get("mps_pipe_directory"),
            }
        )
    trained = [j for j in jobs if j["samples_per_s"] is not None]
    packing = read_packing(sweep_dir)
    by_jobs = rates_by_jobs(buckets, bucket_s)
    # a fixed count is rated with all its jobs training; auto at the count it settled on
    count = int(case.per_gpu) if case.per_gpu.isdigit() else None
    if count is None and packing:
        count = int(max_over_gpus(packing, "jobs_at_a_time") or 0) or None
    if count is None or count not in by_jobs:  # auto without a count: its best-rated count
        count = max((n for n, r in by_jobs.items() if len(r) >= MIN_BUCKETS), default=count)
    return {
        "jobs": len(runs),
        "done": sum(j["status"] == "FINISHED" and not j["cut"] for j in jobs),
        "failed": sum(r.status == "FAILED" for r in runs),
        "cut": sum(j["cut"] for j in jobs),
        "not_recorded": case.jobs - len(runs),
        "rated_at": count,
        "samples_per_s": _mean_rate(by_jobs.get(count or 0, [])),
        "rate_by_jobs": {n: _mean_rate(r) for n, r in sorted(by_jobs.items())},
        "buckets_by_jobs": {n: len(r) for n, r in sorted(by_jobs.items())},
        "packed_samples_per_s": _round(packed_rate(buckets, bucket_s, WINDOW_S), 1),
        "timed_samples_per_s": _round(sum(j["samples_per_s"] for j in trained), 1)
        if case.barrier and trained
        else None,
        "barrier_met": sum(j["barrier_met"] is True for j in jobs) if case.barrier else None,
        "job_samples_per_s_median": _median([j["samples_per_s"] for j in trained]),
        "nvml_peak_mib_median": _median([j["nvml_peak_mib"] for j in jobs]),
        "max_memory_reserved_mib_median": _median([j["max_memory_reserved_mib"] for j in jobs]),
        "at_a_time": at_a_time(attempts_at),
        "oom_attempts": sum(j["oom_attempts"] for j in jobs),
        "gpu_packing": packing,
        "oom_backoffs": None if packing is None else sum_over_gpus(packing, "oom_backoffs"),
        "device": next((j["device"] for j in trained), None),
        "mps_seen_by_jobs": sum(j["mps_pipe_directory"] is not None for j in jobs),
        "per_job": jobs,
    }


def sum_over_gpus(packing: dict[str, dict[str, Any]], key: str) -> int | None:
    """The sum of ``key`` over the GPUs of gpu_packing.json (None: no GPU has it)."""
    values = [int(f[key]) for f in packing.values() if f.get(key) is not None]
    return sum(values) if values else None


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each case over its model's 1 job per GPU with MPS off; auto beside the best fixed
    count; MPS on over off per count; the issue's goals where their cases ran."""
    rate = "samples_per_s"
    anchors: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["case"]["per_gpu"] == "1" and c["case"]["mps"] == "off":
            anchors.setdefault(c["case"]["model"], c)
    for c in cases:
        anchor = anchors.get(c["case"]["model"])
        c["over_one_per_gpu"] = _ratio(c[rate], anchor[rate] if anchor else None)
    autos = {}
    for c in (c for c in cases if c["case"]["per_gpu"] == "auto"):
        model = c["case"]["model"]
        fixed = [f for f in cases if f["case"]["model"] == model and f["case"]["per_gpu"] != "auto"]
        best = max((f for f in fixed if f[rate]), key=lambda f: f[rate], default=None)
        packing = c["gpu_packing"] or {}
        autos[model] = {
            "learned_jobs_at_a_time": max_over_gpus(packing, "jobs_at_a_time"),
            "max_reached": max_over_gpus(packing, "max_reached"),
            "stopped_because": [f.get("stopped_because") for f in packing.values()],
            "peak_gib_per_job": max_over_gpus(packing, "peak_gib_per_job"),
            "peak_source": [f.get("peak_source") for f in packing.values()],
            "at_a_time_seen": c["at_a_time"],
            "best_fixed": None
            if best is None
            else f"{best['case']['per_gpu']}/GPU, MPS {best['case']['mps']}",
            "auto_over_best_fixed": _ratio(c[rate], best[rate] if best else None),
            "auto_over_one_per_gpu": c["over_one_per_gpu"],
        }
    mps = {}
    for on in (c for c in cases if c["case"]["mps"] == "on"):
        key = (on["case"]["model"], on["case"]["per_gpu"])
        off = next((c for c in cases if c["case"]["mps"] == "off" and _key(c) == key), None)
        if off is not None:
            mps[f"{key[0]} {key[1]}/GPU"] = _ratio(on[rate], off[rate])
    return {"auto": autos, "mps_on_over_off": mps, "goals": goals(cases, autos, mps)}


def goals(
    cases: list[dict[str, Any]], autos: dict[str, dict[str, Any]], mps: dict[str, float | None]
) -> dict[str, bool | None]:
    """The goals set for the GPU path, None where their cases did not run."""
    mlp = autos.get("mlp", {})
    near, gain = mlp.get("auto_over_best_fixed"), mlp.get("auto_over_one_per_gpu")
    at_8 = mps.get("mlp 8/GPU")
    oom = [c for c in cases if c["case"]["model"] == "oom"]
    return {
        "mlp auto within 5 % of the best fixed count": None if near is None else near >= 0.95,
        "mlp auto at least 10x 1/GPU": None if gain is None else gain >= 10,
        "mlp MPS on at least as fast as off at 8/GPU": None if at_8 is None else at_8 >= 1.0,
        "no job lost to out-of-memory (oom cases)": None
        if not oom
        else all(c["failed"] == 0 and c["done"] + c["cut"] == c["case"]["jobs"] for c in oom),
    }


def gpu_facts() -> dict[str, Any]:
    """The GPU (from nvidia-smi), the driver, torch and the CUDA it was built with; CUDA is not
    initialised here (a context in the bench would sit beside every case's jobs)."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    smi = shutil.which("nvidia-smi")
    keys = ("name", "driver_version", "memory.total", "compute_mode", "persistence_mode")
    if smi is None:
        facts["gpus"] = "no nvidia-smi on PATH"
    else:
        query = [f"--query-gpu={','.join(keys)}", "--format=csv,noheader"]
        done = subprocess.run([smi, *query], capture_output=True, text=True, timeout=60)
        facts["gpus"] = [
            dict(zip(keys, (p.strip() for p in line.split(",")), strict=False))
            for line in done.stdout.splitlines()
            if line.strip()
        ] or done.stderr.strip()
    facts["nvidia_cuda_mps_control"] = shutil.which("nvidia-cuda-mps-control")
    facts["cores"] = len(os.sched_getaffinity(0))
    return facts


def table(cases: list[dict[str, Any]]) -> str:
    head = (
        "| model | jobs/GPU | MPS | jobs: done / FAILED / cut | samples/s (at n jobs) | x 1/GPU | "
        "best 2 s samples/s | timed samples/s (barrier met) | per job samples/s | NVML peak MiB "
        "| max_memory_reserved MiB | at a time | OOM attempts (back-offs) | wall s |\n"
        + "|---" * 14
        + "|\n"
    )
    rows = []
    for c in cases:
        case = c["case"]
        backoffs = "" if c["oom_backoffs"] is None else f" ({c['oom_backoffs']})"
        met = "" if c["barrier_met"] is None else f" ({c['barrier_met']}/{case['barrier']})"
        cells = [
            case["model"],
            case["per_gpu"],
            case["mps"],
            f"{c['done']} / {c['failed']} / {c['cut']} of {case['jobs']}"
            + ("" if c["returncode"] == 0 else f" rc={c['returncode']}"),
            f"{_cell(c['samples_per_s'])} ({c['rated_at']})",
            _cell(c.get("over_one_per_gpu")),
            _cell(c["packed_samples_per_s"]),
            _cell(c["timed_samples_per_s"]) + met,
            _cell(c["job_samples_per_s_median"]),
            _cell(c["nvml_peak_mib_median"]),
            _cell(c["max_memory_reserved_mib_median"]),
            str(c["at_a_time"]),
            f"{c['oom_attempts']}{backoffs}",
            f"{c['wall_s']:.0f}",
        ]
        rows.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(rows)


def report(results: dict[str, Any]) -> str:
    lines = [f"# GPU packing ({results['machine'].get('date')})\n", f"GPU: {results['gpu']}\n"]
    if results["settings"]["dry"]:
        lines.append("CPU dry run: CPU slots, max_workers as the count, tiny models.\n")
    lines += ["", table(results["cases"])]
    summary = results["summary"]
    for model, auto in summary["auto"].items():
        lines.append(f"auto, {model}: {json.dumps(auto)}\n")
    lines.append(f"MPS on / off: {json.dumps(summary['mps_on_over_off'])}\n")
    lines.append(f"goals: {json.dumps(summary['goals'])}\n")
    if results.get("not_run"):
        lines.append(
            f"not run (the budget of {results['settings']['budget_s']} s left too little, or a "
            f"Ctrl-C): {results['not_run']}\n"
        )
    return "\n".join(lines)


def write(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["summary"] = summarize(results["cases"])
    for suffix, text in ((".json", json.dumps(results, indent=2) + "\n"), (".md", report(results))):
        tmp = out / f"{NAME}{suffix}.tmp"
        tmp.write_text(text)
        tmp.replace(out / f"{NAME}{suffix}")


def settings_from(args: argparse.Namespace) -> Settings:
    s = DRY if args.cpu_dry_run else Settings()
    if args.models:
        s = replace(s, models=tuple(args.models.split(",")))
    if args.counts:
        s = replace(s, counts=tuple(int(k) for k in args.counts.split(",")))
    if args.mps and not s.dry:
        s = replace(s, mps=tuple(args.mps.split(",")))
    for name in ("train_seconds", "budget_s", "gpu"):
        if getattr(args, name) is not None:
            s = replace(s, **{name: getattr(args, name)})
    s = replace(s, auto=s.auto and not args.no_auto, oom=s.oom and not args.no_oom)
    s = replace(s, warm_up=s.warm_up and not args.no_warm_up)
    if not s.dry and launcher_default("mps", None) is None:
        print("hydra.launcher.mps is not an option of this launcher: MPS-on cases not run")
        s = replace(s, mps=("off",), mps_option=False)
    return s


def launcher_default(name: str, missing: Any) -> Any:
    """The furcate launcher's default for ``hydra.launcher.<name>``; ``missing`` without one."""
    from hydra_plugins.furcate_launcher.config import FurcateLauncherConf

    return next((f.default for f in fields(FurcateLauncherConf) if f.name == name), missing)


def launcher_defaults() -> dict[str, Any]:
    names = ("jobs_per_gpu", "max_jobs_per_gpu", "auto_min_gain", "gpu_mem_margin_gb", "mps")
    return {name: launcher_default(name, "(no such option)") for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go")
    parser.add_argument("--cpu-dry-run", action="store_true", help="CPU slots, tiny models")
    parser.add_argument("--models", help="comma-separated: mlp,cnn")
    parser.add_argument("--counts", help="jobs per GPU, comma-separated: 1,8,16,32")
    parser.add_argument("--mps", help="comma-separated: off,on")
    parser.add_argument("--no-auto", action="store_true", help="no jobs_per_gpu=auto cases")
    parser.add_argument("--no-oom", action="store_true", help="no oom model cases")
    parser.add_argument("--no-warm-up", action="store_true", help="no uncounted first sweep")
    parser.add_argument("--train-seconds", type=float, help="a fixed count's timed seconds")
    parser.add_argument("--budget-s", type=float, help="no case starts that cannot end by it")
    parser.add_argument("--gpu", help="the GPU id the sweeps use (default 0)")
    args = parser.parse_args()
    s = settings_from(args)
    cases = plan(s)
    began = time.monotonic()
    results: dict[str, Any] = {
        "machine": _or_error(machine),
        "gpu": gpu_facts(),
        "launcher_defaults": launcher_defaults(),
        "settings": asdict(s),
        "plan": [c.name for c in cases],
        "cases": [],
        "not_run": [],
    }
    print(f"{len(cases)} cases, budget {s.budget_s:.0f} s; GPU {results['gpu']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="furcate-gpu-bench-") as tmp:
        root = Path(tmp)
        if s.warm_up:
            # one short job first, not counted: the first CUDA context on a machine (the driver
            # loading, no persistence mode) and cold library pages would fall on the anchor
            warm = Case(cases[0].model, "1", "off", 1, 1.0, 40.0, 0.0)
            results["warm_up"] = run_case(warm, s, root / "warm-up", 60.0)
        for i, case in enumerate(cases):
            left = s.budget_s - (time.monotonic() - began)
            if left < case.min_s + DRAIN_S:
                results["not_run"].append(case.name)  # a shorter case later may still fit
                continue
            try:
                figures = run_case(case, s, root, left)
            except KeyboardInterrupt:  # its sweep stopped: keep what the others measured
                results["not_run"] += [c.name for c in cases[i:]]
                break
            results["cases"].append(figures)
            write(args.out, results)  # each case as it ends: a cut-off run keeps what it measured
            print(
                f"{case.name}: {figures['done']}/{case.jobs} done, {figures['failed']} FAILED, "
                f"{figures['cut']} cut, {figures['samples_per_s']} samples/s at "
                f"{figures['rated_at']} jobs, best 2 s {figures['packed_samples_per_s']}, "
                f"at a time {figures['at_a_time']}, OOM {figures['oom_attempts']}, "
                f"wall {figures['wall_s']} s",
                flush=True,
            )
    write(args.out, results)
    print("\n" + report(results))
    print(f"wrote {args.out / NAME}.json and .md")


def _or_error(call: Any) -> dict[str, Any]:
    try:
        return dict(call())
    except Exception as exc:  # e.g. a package without metadata: the figures matter more
        return {"error": repr(exc)}


def _key(case: dict[str, Any]) -> tuple[str, str]:
    return case["case"]["model"], case["case"]["per_gpu"]


def _ratio(value: float | None, anchor: float | None) -> float | None:
    return None if value is None or not anchor else round(value / anchor, 3)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _mean_rate(rates: list[float]) -> float | None:
    """A count's rate: its buckets' samples over their time (a mean: a bucket between two slow
    steps holds none), once it has ``MIN_BUCKETS`` of them."""
    return round(statistics.fmean(rates), 1) if len(rates) >= MIN_BUCKETS else None


def _median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"


if __name__ == "__main__":
    main()
