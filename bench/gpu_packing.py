"""Small training jobs packed onto one GPU: throughput, memory and OOM back-off per packing.

Aggregate samples/s at 1, 2, 4 and 8 jobs per GPU, with NVIDIA's MPS off and on, and with
``jobs_per_gpu=auto``; each job's GPU memory as NVML sees it beside
``torch.cuda.max_memory_reserved``; the back-off of a model sized to run out of GPU memory at 8
jobs per GPU.

Each case is a real sweep through the Hydra CLI, a fresh interpreter, its own sqlite MLflow
store (every job recorded, as a user's sweep is) and sweep dir:

    python bench/apps/gpu_train_app.py -m model=M seed=range(0,N) train_seconds=T
        hydra/launcher=furcate hydra.launcher.gpus=[0] hydra.launcher.jobs_per_gpu=K
        hydra.launcher.mps=off|on hydra.launcher.trace_interval_s=0.5 ...

N = 2 x K jobs (every slot used twice; ``--waves``), each training ``T`` = 4 s after its own
start-up. Models (``bench/apps/gpu_train_app.py``): ``mlp`` and ``cnn`` (small: one job leaves
an H100 mostly idle), ``oom`` (the MLP beside 1/6 of the GPU's memory: 5 jobs fit, 8 do not),
run at 8 per GPU and at auto. Figures per case:

  sweep samples/s  all jobs' samples / (last job end - first job start), run_data.csv's times:
                   each job's start-up counts, as it does for a user
  x 1/GPU          that over the same model at 1 job per GPU, MPS off, in the same run
  train samples/s  samples / (last training end - first training start), from bench.json
  NVML peak        per job the highest gpu_mem_mb of its trace.csv (its CUDA context
                   included), median over jobs, beside max_memory_reserved (torch's allocator)
  at a time        the most jobs running at once, by their tasks' own start and end
  OOM              attempts that ended in CUDA out-of-memory (each job's attempts.jsonl), and
                   the back-offs of gpu_packing.json
For auto, gpu_packing.json's ``max_reached`` beside the fixed count with the best sweep
samples/s. The GPU (nvidia-smi: name, driver, memory), torch and its CUDA are recorded.

A one-job sweep runs first and is not counted (the machine's first CUDA context, cold pages).
``--cpu-dry-run`` proves the harness without a GPU: CPU slots (``gpus=[]``, ``max_workers``
for the count; ``jobs_per_gpu`` and ``mps`` are not passed), tiny models, 1 s jobs. Where the
launcher has no ``hydra.launcher.mps`` option, the MPS-on cases are left out (and said so).

Run: ``python bench/gpu_packing.py --out DIR`` (~7 min on one H100, stops starting cases after
``--budget-s``); ``--quick`` (~3 min); writes gpu_packing_bench.json and .md to DIR (default
bench/results), each case as it ends, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR, machine
from bench.sweep_reading import (
    at_a_time,
    max_over_gpus,
    read_attempts,
    read_job_runs,
    read_packing,
    trace_peak_mib,
)

APP = Path(__file__).resolve().parent / "apps" / "gpu_train_app.py"
NAME = "gpu_packing_bench"
TRACE_S = 0.5
OOM_PER_GPU = 8  # the oom model's block is sized so that this many cannot fit


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("mlp", "cnn")
    counts: tuple[int, ...] = (1, 2, 4, 8)
    mps: tuple[str, ...] = ("off", "on")
    auto: bool = True
    oom: bool = True
    train_seconds: float = 4.0
    waves: int = 2
    budget_s: float = 480.0
    gpu: str = "0"
    dry: bool = False
    # whether this launcher has hydra.launcher.mps; without it only the MPS-off cases run
    mps_option: bool = True


QUICK = Settings(models=("mlp",), counts=(1, 4), train_seconds=3.0, budget_s=200.0)
DRY = Settings(models=("mlp",), counts=(1, 2), mps=("off",), train_seconds=1.0, dry=True)


@dataclass(frozen=True)
class Case:
    """One sweep: a model at ``per_gpu`` jobs per GPU ("1", ... or "auto") with ``mps``."""

    model: str
    per_gpu: str
    mps: str
    jobs: int

    @property
    def name(self) -> str:
        return f"{self.model}-{self.per_gpu}-per-gpu-mps-{self.mps}"


def plan(s: Settings) -> list[Case]:
    """The cases in the order they run: what later figures are divided by comes first."""
    top = max(s.counts)
    cases: list[Case] = []
    for i, model in enumerate(s.models):
        if 1 in s.counts:
            cases.append(Case(model, "1", s.mps[0], s.waves))  # the anchor
        cases += [Case(model, str(k), m, s.waves * k) for m in s.mps for k in s.counts if k > 1]
        if s.auto:
            cases.append(Case(model, "auto", "auto", s.waves * top))
        if 1 in s.counts:  # MPS's own cost on one job, least needed: last
            cases += [Case(model, "1", m, s.waves) for m in s.mps[1:]]
        if i == 0 and s.oom:
            k = top if s.dry else OOM_PER_GPU
            cases.append(Case("oom", str(k), "off", s.waves * k))
            if s.auto:
                cases.append(Case("oom", "auto", "auto", s.waves * k))
    return cases


def overrides(case: Case, s: Settings, sweep_dir: Path, store: Path) -> list[str]:
    args = [
        f"model={case.model}",
        f"seed=range(0,{case.jobs})",
        f"train_seconds={s.train_seconds}",
        "hydra/launcher=furcate",
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.launcher.mlflow.tracking_uri=sqlite:///{store}",
        f"hydra.launcher.trace_interval_s={TRACE_S}",
        "hydra.launcher.echo_output=false",
        "hydra.launcher.progress=plain",
    ]
    if case.model == "oom":  # its memory grows 60 % into its training (see the app)
        args.append(f"oom_after_s={0.6 * s.train_seconds:g}")
    top = max(s.counts) if case.model != "oom" or s.dry else OOM_PER_GPU
    if s.dry:
        count = top if case.per_gpu == "auto" else int(case.per_gpu)
        return [*args, "tiny=true", "hydra.launcher.gpus=[]", f"hydra.launcher.max_workers={count}"]
    args += [f"hydra.launcher.gpus=[{s.gpu}]", f"hydra.launcher.jobs_per_gpu={case.per_gpu}"]
    if s.mps_option:
        args.append(f"hydra.launcher.mps={case.mps}")
    if case.per_gpu == "auto":
        args.append(f"hydra.launcher.max_jobs_per_gpu={top}")
    return args


def run_case(case: Case, s: Settings, root: Path, template: Path, timeout: float) -> dict[str, Any]:
    """Run one sweep through the CLI, then read what it left."""
    where = root / case.name
    where.mkdir(parents=True)
    store = where / "mlflow.db"
    shutil.copyfile(template, store)
    sweep_dir = where / "sweep"
    command = [sys.executable, str(APP), "-m", *overrides(case, s, sweep_dir, store)]
    log = where / "command.log"
    began = time.time()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            cwd=where,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        code = wait_or_stop(process, timeout)
    figures: dict[str, Any] = {
        "case": asdict(case),
        "command": command[1:],
        "returncode": code,
        "timed_out": code is None,
        "wall_s": round(time.time() - began, 2),
        **read_case(sweep_dir),
    }
    if code != 0:
        figures["log_tail"] = log.read_text(errors="replace")[-4000:]
    return figures


def wait_or_stop(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code; None where the sweep outran ``timeout`` and was stopped (Ctrl-C, as a
    user would: the launcher stops its jobs and its MPS daemon; a kill 30 s later). A Ctrl-C
    of the bench stops the sweep (in a session of its own, it does not get it) the same way."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        return None
    except KeyboardInterrupt:
        stop(process)
        raise


def stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def read_case(sweep_dir: Path) -> dict[str, Any]:
    """A finished sweep's figures: its jobs, their samples and memory, the packing."""
    runs = read_job_runs(sweep_dir)
    jobs: list[dict[str, Any]] = []
    # jobs running at once by their tasks' own clocks: run_data.csv's end is when the launcher
    # took the job's end in, a few ms after the next job on its slot began
    attempts_at: list[tuple[float, float]] = []
    for run in runs:
        path = run.output_dir / "bench.json"
        info = json.loads(path.read_text()) if path.exists() else {}
        attempts = read_attempts(run.output_dir)
        attempts_at += [(a.started_at, a.ended_at) for a in attempts]
        jobs.append(
            {
                "num": run.num,
                "status": run.status,
                "samples": info.get("samples"),
                "samples_per_s": info.get("samples_per_s"),
                "train_began": info.get("train_began"),
                "train_ended": info.get("train_ended"),
                "nvml_peak_mib": trace_peak_mib(run.output_dir),
                "max_memory_reserved_mib": info.get("max_memory_reserved_mib"),
                "block_mib": info.get("block_mib"),
                "attempts": len(attempts),
                "oom_attempts": sum(a.outcome == "oom" for a in attempts),
                "device": info.get("device"),
                "mps_pipe_directory": info.get("mps_pipe_directory"),
            }
        )
    spans = [(r.start, r.end) for r in runs if r.start is not None and r.end is not None]
    trained = [j for j in jobs if j["samples"] is not None]
    samples = sum(j["samples"] for j in trained)
    span = max(e for _, e in spans) - min(b for b, _ in spans) if spans else None
    train_span = (
        max(j["train_ended"] for j in trained) - min(j["train_began"] for j in trained)
        if trained
        else None
    )
    packing = read_packing(sweep_dir)
    return {
        "jobs": len(runs),
        "finished": sum(r.status == "FINISHED" for r in runs),
        "samples": samples,
        "span_s": _round(span, 3),
        "sweep_samples_per_s": _round(samples / span if span else None, 1),
        "train_samples_per_s": _round(samples / train_span if train_span else None, 1),
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
    """Each case over its model's 1 job per GPU (its first MPS mode: off unless ``--mps``
    says otherwise); auto beside the best fixed count."""
    anchors: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["case"]["per_gpu"] == "1":
            anchors.setdefault(c["case"]["model"], c)
    for c in cases:
        anchor = anchors.get(c["case"]["model"])
        ratio = None
        if anchor and anchor["sweep_samples_per_s"] and c["sweep_samples_per_s"] is not None:
            ratio = round(c["sweep_samples_per_s"] / anchor["sweep_samples_per_s"], 3)
        c["over_one_per_gpu"] = ratio
    autos = {}
    for c in (c for c in cases if c["case"]["per_gpu"] == "auto"):
        model = c["case"]["model"]
        fixed = [
            f
            for f in cases
            if f["case"]["model"] == model
            and f["case"]["per_gpu"] != "auto"
            and f["sweep_samples_per_s"]
        ]
        best = max(fixed, key=lambda f: f["sweep_samples_per_s"], default=None)
        packing = c["gpu_packing"]
        autos[model] = {
            "auto_max_reached": None if packing is None else max_over_gpus(packing, "max_reached"),
            "auto_jobs_at_a_time_at_end": None
            if packing is None
            else max_over_gpus(packing, "jobs_at_a_time"),
            "auto_peak_gib_per_job": None
            if packing is None
            else max_over_gpus(packing, "peak_gib_per_job"),
            "auto_at_a_time_seen": c["at_a_time"],
            "auto_oom_backoffs": c["oom_backoffs"],
            "gpu_packing_json": "present" if packing is not None else "absent",
            "best_fixed": None if best is None else best["case"],
            "auto_over_best_fixed": None
            if best is None or c["sweep_samples_per_s"] is None
            else round(c["sweep_samples_per_s"] / best["sweep_samples_per_s"], 3),
        }
    return {"auto": autos}


def gpu_facts() -> dict[str, Any]:
    """The GPU (from nvidia-smi), the driver, torch and the CUDA it was built with."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    smi = shutil.which("nvidia-smi")
    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    if smi is None:
        facts["gpus"] = "no nvidia-smi on PATH"
    else:
        done = subprocess.run([smi, *query], capture_output=True, text=True, timeout=60)
        facts["gpus"] = [
            dict(
                zip(
                    ("name", "driver", "memory"), (p.strip() for p in line.split(",")), strict=False
                )
            )
            for line in done.stdout.splitlines()
            if line.strip()
        ] or done.stderr.strip()
    facts["nvidia_cuda_mps_control"] = shutil.which("nvidia-cuda-mps-control")
    return facts


def empty_store(path: Path) -> None:
    """An initialised, empty MLflow sqlite store, copied for every case (its migrations run
    once, not in each case's clock)."""
    from mlflow.tracking import MlflowClient

    from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation

    ignore_mlflow_sqlalchemy_deprecation()
    MlflowClient(f"sqlite:///{path}").search_experiments()


def table(cases: list[dict[str, Any]]) -> str:
    head = (
        "| model | jobs/GPU | MPS | jobs (finished) | sweep samples/s | x 1/GPU | "
        "train samples/s | per job samples/s | NVML peak MiB | max_memory_reserved MiB | "
        "at a time | OOM attempts (back-offs) |\n" + "|---" * 12 + "|\n"
    )
    rows = []
    for c in cases:
        case = c["case"]
        backoffs = "" if c["oom_backoffs"] is None else f" ({c['oom_backoffs']})"
        cells = [
            case["model"],
            case["per_gpu"],
            case["mps"],
            f"{c['jobs']} ({c['finished']})"
            + ("" if c["returncode"] == 0 else f" rc={c['returncode']}"),
            _cell(c["sweep_samples_per_s"]),
            _cell(c.get("over_one_per_gpu")),
            _cell(c["train_samples_per_s"]),
            _cell(c["job_samples_per_s_median"]),
            _cell(c["nvml_peak_mib_median"]),
            _cell(c["max_memory_reserved_mib_median"]),
            str(c["at_a_time"]),
            f"{c['oom_attempts']}{backoffs}",
        ]
        rows.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(rows)


def report(results: dict[str, Any]) -> str:
    lines = [f"# GPU packing ({results['machine']['date']})\n", f"GPU: {results['gpu']}\n"]
    if results["settings"]["dry"]:
        lines.append("CPU dry run: CPU slots, max_workers as the count, tiny models.\n")
    lines += ["", table(results["cases"])]
    for model, auto in results["summary"]["auto"].items():
        lines.append(f"auto, {model}: {json.dumps(auto)}\n")
    if results.get("not_run"):
        lines.append(
            f"not run (the budget of {results['settings']['budget_s']} s spent, or a Ctrl-C): "
            f"{results['not_run']}\n"
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
    s = DRY if args.cpu_dry_run else QUICK if args.quick else Settings()
    if args.models:
        s = replace(s, models=tuple(args.models.split(",")))
    if args.counts:
        s = replace(s, counts=tuple(int(k) for k in args.counts.split(",")))
    if args.mps and not s.dry:
        s = replace(s, mps=tuple(args.mps.split(",")))
    for name in ("train_seconds", "waves", "budget_s", "gpu"):
        if getattr(args, name) is not None:
            s = replace(s, **{name: getattr(args, name)})
    s = replace(s, auto=s.auto and not args.no_auto, oom=s.oom and not args.no_oom)
    if not has_mps_option() and not s.dry:
        print("hydra.launcher.mps is not an option of this launcher: MPS-on cases not run")
        s = replace(s, mps=("off",), mps_option=False)
    return s


def has_mps_option() -> bool:
    from hydra_plugins.furcate_launcher.config import FurcateLauncherConf

    return "mps" in {f.name for f in fields(FurcateLauncherConf)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go")
    parser.add_argument("--quick", action="store_true", help="mlp at 1 and 4 per GPU, 3 s jobs")
    parser.add_argument("--cpu-dry-run", action="store_true", help="CPU slots, tiny models")
    parser.add_argument("--models", help="comma-separated: mlp,cnn")
    parser.add_argument("--counts", help="jobs per GPU, comma-separated: 1,2,4,8")
    parser.add_argument("--mps", help="comma-separated: off,on")
    parser.add_argument("--no-auto", action="store_true", help="no jobs_per_gpu=auto cases")
    parser.add_argument("--no-oom", action="store_true", help="no oom model cases")
    parser.add_argument("--train-seconds", type=float, help="each job's training (default 4)")
    parser.add_argument("--waves", type=int, help="jobs per slot in each sweep (default 2)")
    parser.add_argument("--budget-s", type=float, help="start no case after this (default 480)")
    parser.add_argument("--gpu", help="the GPU id the sweeps use (default 0)")
    args = parser.parse_args()
    s = settings_from(args)
    cases = plan(s)
    results: dict[str, Any] = {
        "machine": machine(),
        "gpu": gpu_facts(),
        "settings": asdict(s),
        "cases": [],
    }
    print(f"{len(cases)} cases; GPU {results['gpu']}", flush=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="furcate-gpu-bench-") as tmp:
        root = Path(tmp)
        empty_store(root / "template.db")
        # one short job first, not counted: the first CUDA context on a machine (the driver
        # loading, no persistence mode) and cold library pages would fall on the anchor alone
        warm_up = Case(cases[0].model, "1", "off", 1)
        short = replace(s, train_seconds=1.0)
        results["warm_up"] = run_case(warm_up, short, root / "warm-up", root / "template.db", 120)
        for i, case in enumerate(cases):
            left = s.budget_s - (time.monotonic() - began)
            if left <= 0:
                results["not_run"] = [c.name for c in cases[i:]]
                break
            try:
                figures = run_case(case, s, root, root / "template.db", max(60.0, left + 90.0))
            except KeyboardInterrupt:  # its sweep stopped: keep what the others measured
                results["not_run"] = [c.name for c in cases[i:]]
                break
            results["cases"].append(figures)
            write(args.out, results)  # each case as it ends: a cut-off run keeps what it measured
            print(
                f"{case.name}: {figures['finished']}/{case.jobs} finished, "
                f"{figures['sweep_samples_per_s']} samples/s, at a time {figures['at_a_time']}, "
                f"OOM {figures['oom_attempts']}, wall {figures['wall_s']} s",
                flush=True,
            )
    write(args.out, results)
    print("\n" + report(results))
    print(f"wrote {args.out / NAME}.json and .md")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"


if __name__ == "__main__":
    main()
