"""DDP ranks started warm: a rank Lightning's subprocess launcher starts in a furcate job is a
fork of the job's process that behaves as ``python <command>`` would.

The fork against a new interpreter: each script runs twice from the same stand-in for a job's
process (``tests/rank_fork_parent.py``), forked warm and started as Lightning starts it (a
``Popen``), and what each saw and how each ended must be the same. Then Lightning's private
names the routing reads, the MLflow client ranks other than 0 never build, and a real sweep of
DDP jobs through the CLI against the app run alone.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from furcate_hydra.job_process import lightning_private
from furcate_hydra.job_process.fresh_interpreter import Command
from tests.conftest import APPS, run_cli
from tests.store_helpers import job_runs

PARENT = Path(__file__).parent / "rank_fork_parent.py"

APP_PARTS = """\
import os
from omegaconf import OmegaConf

IMPORTED_IN = os.getpid()
OmegaConf.register_new_resolver("twice", lambda x: 2 * int(x))
"""
# what a rank sees of its process; then a thread it leaves running and an exit handler
OBSERVE = """\
import atexit, decimal, json, os, signal, sys, threading, time
from pathlib import Path
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
import app_parts

out = Path(sys.argv[1])
names = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP", "SIGPIPE")
seen = {
    "name": __name__,
    "file": __file__,
    "spec": None if __spec__ is None else __spec__.name,
    "argv": sys.argv,
    "orig_argv": sys.orig_argv[1:],
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "ppid": os.getppid(),
    "env": [os.environ.get("JOB_ONLY"), os.environ.get("GIVEN")],
    "hydra_initialized": GlobalHydra.instance().is_initialized(),
    "signals": {n: repr(signal.getsignal(getattr(signal, n))) for n in names},
    "decimal_prec": decimal.getcontext().prec,
    "resolver": OmegaConf.create({"x": "${twice:4}"}).x,
    "app_module_imported_here": app_parts.IMPORTED_IN == os.getpid(),
    "excepthook_default": sys.excepthook is sys.__excepthook__,
}
out.write_text(json.dumps(seen))
print("to stdout")


def later():
    time.sleep(0.3)
    out.with_suffix(".thread").write_text("waited for")


threading.Thread(target=later).start()
atexit.register(out.with_suffix(".atexit").write_text, "ran")
"""
# each past its task's start, which a rank's Hydra callback says (a failure before it starts
# the rank again as a new interpreter)
ENTERED = "from furcate_hydra.job_process.fresh_interpreter import task_entered\ntask_entered()\n"
ENDINGS = {
    "returns": (f"{ENTERED}print('done')\n", 0),
    "sys_exit_3": (f"{ENTERED}import sys\nsys.exit(3)\n", 3),
    "sys_exit_message": (f"{ENTERED}import sys\nsys.exit('bye')\n", 1),
    "raises": (f"{ENTERED}def fail():\n    raise ValueError('boom')\n\n\nfail()\n", 1),
    "ctrl_c": (f"{ENTERED}raise KeyboardInterrupt\n", -signal.SIGINT),
}


def fork_from_a_job(tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec`` in the stand-in for a job's process; its result."""
    spec = {"app_dir": str(app_dir(tmp_path)), "result": str(tmp_path / "result.json"), **spec}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(PARENT), str(path)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "result.parent-atexit").exists()  # the job's handler: not a rank's
    result: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    return result


def app_dir(tmp_path: Path) -> Path:
    """The app's dir: its own module, a package, the scripts the tests write."""
    where = tmp_path / "app"
    if not where.exists():
        (where / "pkg").mkdir(parents=True)
        (where / "app_parts.py").write_text(APP_PARTS)
        (where / "pkg" / "__init__.py").write_text("")
        (where / "pkg" / "observe.py").write_text(OBSERVE)
        (where / "observe.py").write_text(OBSERVE)
        (tmp_path / "work").mkdir()
    return where


def both_ways(name: str, command: list[str], tmp_path: Path, **run: Any) -> list[dict[str, Any]]:
    """The run of ``command`` warm and cold (Lightning's Popen), each with its out and err."""
    return [
        {
            "command": command,
            "out": str(tmp_path / f"{name}-{way}.out"),
            "err": str(tmp_path / f"{name}-{way}.err"),
            "cold": way == "cold",
            **run,
        }
        for way in ("warm", "cold")
    ]


def seen_by(path: Path) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(path.read_text())
    return seen


def outputs(tmp_path: Path, name: str) -> dict[str, tuple[str, str]]:
    return {
        way: tuple(  # type: ignore[misc]
            (tmp_path / f"{name}-{way}.{kind}").read_text() for kind in ("out", "err")
        )
        for way in ("warm", "cold")
    }


@pytest.mark.parametrize("form", ["script", "module"])
def test_a_forked_rank_sees_what_a_new_interpreter_started_by_lightning_sees(
    tmp_path: Path, form: str
) -> None:
    app = app_dir(tmp_path)
    env = {**os.environ, "GIVEN": "yes"}  # Lightning's env copy; JOB_ONLY set after it
    runs: list[dict[str, Any]] = []
    for way in ("warm", "cold"):
        seen = tmp_path / f"seen-{way}.json"
        if form == "script":
            command, cwd = [sys.executable, str(app / "observe.py"), str(seen)], tmp_path / "work"
        else:
            command, cwd = [sys.executable, "-m", "pkg.observe", str(seen)], app
        runs.append(
            {
                "command": command,
                "env": env,
                "cwd": str(cwd),
                "out": str(tmp_path / f"{way}.out"),
                "err": str(tmp_path / f"{way}.err"),
                "cold": way == "cold",
            }
        )
    result = fork_from_a_job(tmp_path, {"runs": runs})
    assert [run["returncode"] for run in result["runs"]] == [0, 0]
    warm, cold = (seen_by(tmp_path / f"seen-{way}.json") for way in ("warm", "cold"))
    first = str(app / "observe.py" if form == "script" else app / "pkg" / "observe.py")
    for observed, run in zip((warm, cold), runs, strict=True):  # each its own seen file
        assert observed.pop("argv") == [first, run["command"][-1]]
        assert observed.pop("orig_argv") == run["command"][1:]
    assert warm == cold  # cwd, sys.path[0], parent, env, Hydra, signals, context, modules
    assert warm["name"] == "__main__"
    assert warm["spec"] == (None if form == "script" else "pkg.observe")
    assert warm["env"] == [None, "yes"] and not warm["hydra_initialized"]
    assert warm["signals"]["SIGUSR1"] == warm["signals"]["SIGTERM"] == "<Handlers.SIG_DFL: 0>"
    assert warm["signals"]["SIGHUP"] == "<Handlers.SIG_IGN: 1>"  # the job's: exec keeps it
    # Python's own, unless this run started with Ctrl-C ignored (a background job's), which a
    # new interpreter keeps too
    assert ("SIG_IGN" if _ctrl_c_ignored() else "default_int_handler") in warm["signals"]["SIGINT"]
    assert warm["decimal_prec"] == 28 and warm["resolver"] == 8
    assert warm["app_module_imported_here"] and warm["excepthook_default"]
    for way in ("warm", "cold"):  # its thread waited for, its exit handler run
        seen_file = tmp_path / f"seen-{way}.json"
        assert seen_file.with_suffix(".thread").exists()
        assert seen_file.with_suffix(".atexit").exists()
        assert (tmp_path / f"{way}.out").read_text() == "to stdout\n"


def _ctrl_c_ignored() -> bool:
    """Whether a process this test starts begins with SIGINT ignored."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() == "True"


def test_a_forked_rank_ends_as_a_new_interpreter_would(tmp_path: Path) -> None:
    app = app_dir(tmp_path)
    runs = []
    for name, (code, _) in ENDINGS.items():
        (app / f"{name}.py").write_text(code)
        runs += both_ways(name, [sys.executable, str(app / f"{name}.py")], tmp_path)
    result = fork_from_a_job(tmp_path, {"runs": runs})
    codes = [run["returncode"] for run in result["runs"]]
    for i, (name, (_, expected)) in enumerate(ENDINGS.items()):
        assert codes[2 * i : 2 * i + 2] == [expected, expected], name
        seen = outputs(tmp_path, name)
        assert seen["warm"] == seen["cold"], name  # its traceback, its message, its output
    assert "Traceback (most recent call last)" in outputs(tmp_path, "raises")["warm"][1]
    assert "furcate_hydra" not in outputs(tmp_path, "raises")["warm"][1]
    assert [run["poll_after"] for run in result["runs"]] == codes


def test_a_rank_that_fails_before_its_task_starts_again_as_a_new_interpreter(
    tmp_path: Path,
) -> None:
    # the app's module registers with a library at its import, which the job did: imported
    # again in a warm rank, it finds its name taken, as it never would in a new interpreter
    app = app_dir(tmp_path)
    (app / "registering.py").write_text(
        "import torch\n\nLIB = torch.library.Library('furcate_warm_rank', 'DEF')\n"
        "LIB.define('twice(Tensor x) -> Tensor')\n"
    )
    (app / "uses_registry.py").write_text("import registering\n\nprint('registered once')\n")
    run = {
        "command": [sys.executable, str(app / "uses_registry.py")],
        "out": str(tmp_path / "out"),
        "err": str(tmp_path / "err"),
    }
    spec = {"runs": [run], "job_imports": ["registering"]}
    (rank,) = fork_from_a_job(tmp_path, spec)["runs"]
    err = (tmp_path / "err").read_text()
    assert rank["returncode"] == 0, err
    assert (tmp_path / "out").read_text() == "registered once\n"
    assert err.startswith(
        "furcate: this DDP rank starts again as a new interpreter: before its task, the warm "
        "start failed (RuntimeError: Only a single TORCH_LIBRARY can be used"
    ), err
    assert err.count("\n") == 1  # the new interpreter's own start said nothing


def test_a_forked_rank_is_signalled_and_reaped_as_lightning_uses_a_popen(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    script = app_dir(tmp_path) / "sleeps.py"
    script.write_text(
        f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(120)\n"
    )
    run = {
        "command": [sys.executable, str(script)],
        "out": str(tmp_path / "out"),
        "err": str(tmp_path / "err"),
        "ready": str(ready),
        "signal": "SIGTERM",
    }
    (rank,) = fork_from_a_job(tmp_path, {"runs": [run]})["runs"]
    assert rank["poll_running"] is None and rank["wait_timed_out"]
    assert rank["returncode"] == rank["poll_after"] == -signal.SIGTERM


def test_a_rank_starts_cold_where_a_fork_could_not_run_it_and_says_why(tmp_path: Path) -> None:
    reasons = fork_from_a_job(
        tmp_path, {"reasons": ["none", "python_thread", "cuda", "native_thread"]}
    )["reasons"]
    assert reasons["none"] is None
    assert reasons["python_thread"] is None  # a Python thread's locks are never the rank's
    assert "CUDA is initialised in the job's process" in reasons["cuda"]
    assert "1 thread(s) that Python did not start" in reasons["native_thread"]
    assert "OpenMP" in reasons["native_thread"]


def test_a_command_a_fork_cannot_become_is_left_to_popen() -> None:
    python = sys.executable
    assert Command.parse([python, "train.py", "a=1"]) == Command(
        (python, "train.py", "a=1"), "train.py", None, ("a=1",)
    )
    assert Command.parse([python, "-m", "pkg.train", "a=1"]) == Command(
        (python, "-m", "pkg.train", "a=1"), None, "pkg.train", ("a=1",)
    )
    for other in (["/other/python", "train.py"], [python, "-u", "train.py"], [python, "-m"]):
        assert Command.parse(other) is None


# -- Lightning's private names ---------------------------------------------------------------


@pytest.mark.parametrize("namespace", list(lightning_private.LAUNCHER_MODULES))
def test_lightning_subprocess_launcher_starts_its_ranks_through_the_routed_popen(
    namespace: str, monkeypatch: pytest.MonkeyPatch, hydra_restore_singletons: Any
) -> None:
    from hydra.core.hydra_config import HydraConfig

    importlib.import_module(namespace)
    HydraConfig.instance().cfg = None  # not in a Hydra run here
    monkeypatch.setattr(os, "environ", dict(os.environ))  # Lightning sets MASTER_ADDR etc.
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    modules = launchers_restored_after(namespace, monkeypatch)
    started: list[tuple[list[str], dict[str, str], str | None]] = []
    popen = functools.partial(_record, started)
    lightning_private.route_rank_processes(namespace, lambda: popen)
    lightning_private.route_rank_processes(namespace, lambda: popen)  # once a class
    # as Lightning words it: the script, or -m where the test runner was started so
    main_spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = (
        [sys.executable, os.path.abspath(sys.argv[0])]
        if main_spec is None
        else [
            sys.executable,
            "-m",
        ]
    )
    for module in modules:
        started.clear()
        environments = module.__name__.split(".strategies")[0] + ".plugins.environments"
        environment = importlib.import_module(environments).LightningEnvironment()
        launcher = module._SubprocessScriptLauncher(environment, num_processes=3, num_nodes=1)
        launcher._call_children_scripts()
        assert launcher.procs == ["rank 1", "rank 2"], module.__name__
        assert [command[:2] for command, _, _ in started] == [head] * 2
        assert [env["LOCAL_RANK"] for _, env, _ in started] == ["1", "2"]
        assert {env["WORLD_SIZE"] for _, env, _ in started} == {"3"}
        assert module.subprocess is subprocess  # the module's own again, after the call


def test_where_cuda_is_initialised_the_ranks_start_as_lightning_starts_them_and_it_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, hydra_restore_singletons: Any
) -> None:
    from hydra.core.hydra_config import HydraConfig

    from furcate_hydra.job_process import warm_ranks

    HydraConfig.instance().cfg = None
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as after a CUDA op
    started: list[tuple[list[str], dict[str, str], str | None]] = []
    monkeypatch.setattr(subprocess, "Popen", functools.partial(_record, started))
    (module, _) = launchers_restored_after("lightning.pytorch", monkeypatch)
    warm_ranks.route_ranks("lightning.pytorch")
    environment = importlib.import_module("lightning.fabric.plugins.environments")
    launcher = module._SubprocessScriptLauncher(
        environment.LightningEnvironment(), num_processes=3, num_nodes=1
    )
    with caplog.at_level(logging.INFO, logger=warm_ranks.__name__):
        launcher._call_children_scripts()
    assert launcher.procs == ["rank 1", "rank 2"]  # Lightning's own Popen made them
    assert caplog.messages == [
        "furcate: this job's DDP ranks start as new interpreters: CUDA is initialised in the "
        "job's process: a fork cannot use it."
    ]


def launchers_restored_after(namespace: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The launcher modules of ``namespace``, whose classes are as Lightning has them again
    after the test (routing wraps a method of each)."""
    modules = [
        importlib.import_module(name) for name in lightning_private.LAUNCHER_MODULES[namespace]
    ]
    for module in modules:
        launcher_class = module._SubprocessScriptLauncher
        monkeypatch.setattr(launcher_class, "_call_children_scripts",
                            launcher_class._call_children_scripts)  # fmt: skip
    return modules


def _record(
    started: list[tuple[list[str], dict[str, str], str | None]],
    command: list[str],
    env: dict[str, str],
    cwd: str | None = None,
) -> str:
    """A rank's start, recorded instead of made: Lightning's Popen call."""
    started.append((command, env, cwd))
    return f"rank {env['LOCAL_RANK']}"


def test_lightning_rank_zero_starts_from_the_environment_in_a_forked_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lightning.fabric  # noqa: F401  (its rank_zero module)
    from lightning_utilities.core.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 0)  # rank 0's, as a fork of it has
    monkeypatch.setenv("LOCAL_RANK", "2")
    lightning_private.fresh_lightning_state()
    assert getattr(rank_zero_only, "rank") == 2  # noqa: B009 (set on a function object)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("lightning.pytorch.strategies.launchers.subprocess_script", "subprocess"),
        ("lightning.fabric.strategies.launchers.subprocess_script", "subprocess"),
        ("lightning.fabric.utilities.rank_zero", "_get_rank"),
    ],
)
def test_a_moved_lightning_name_fails_naming_it(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    launchers_restored_after("lightning.pytorch", monkeypatch)
    monkeypatch.delattr(importlib.import_module(module), name)
    with pytest.raises(lightning_private.LightningPrivateMoved) as raised:
        lightning_private.route_rank_processes("lightning.pytorch", lambda: subprocess.Popen)
    message = str(raised.value)
    where = module if name == "_get_rank" else f"{module}._SubprocessScriptLauncher"
    assert where in message and "lightning 2.6" in message


# -- the MLflow client of a rank other than 0 ----------------------------------------------


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_an_mlflow_logger_builds_its_client_in_rank_zero_only(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_utilities.core.rank_zero import rank_zero_only

    from furcate_hydra.known_warnings import ignore_mlflow_sqlalchemy_deprecation
    from furcate_hydra.lightning._lazy_client import ClientOnFirstUse, client_for_this_rank

    ignore_mlflow_sqlalchemy_deprecation()  # MLflow's SQL store, as furcate's jobs build it
    logger_class = importlib.import_module(f"{namespace}.loggers").MLFlowLogger
    for rank in (1, 0):
        monkeypatch.setattr(rank_zero_only, "rank", rank)
        store = tmp_path / f"rank{rank}.db"
        with client_for_this_rank():
            logger = logger_class(tracking_uri=f"sqlite:///{store}")
        # MLflow's sqlite store makes its file when it is built: in rank 0 only
        assert store.exists() == (rank == 0)
        assert isinstance(logger._mlflow_client, ClientOnFirstUse) == (rank == 1)
    lazy = ClientOnFirstUse(f"sqlite:///{tmp_path / 'later.db'}")
    assert lazy.search_experiments()[0].name == "Default"  # built once used


# -- a real sweep ----------------------------------------------------------------------------


def ranks_seen(job_dir: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in (job_dir / "ranks.jsonl").read_text().splitlines()]
    return {row["rank"]: row for row in rows}


@pytest.mark.slow
def test_a_ddp_jobs_ranks_are_forks_of_its_process_and_train_as_the_app_alone(
    tmp_path: Path, mlflow_store: str
) -> None:
    # job 0 forks its rank; job 1 has started OpenMP's threads (2 threads, a parallel op)
    done = run_cli(
        APPS / "warm_rank_app.py",
        "-m",
        "before_fit=nothing,parallel_op",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert {run.info.status for run in job_runs(mlflow_store)} == {"FINISHED"}
    warm, cold = (ranks_seen(tmp_path / "sweep" / str(num)) for num in (0, 1))
    # rank 1 of job 0: a child of the job's process, torch loaded before its script ran, its
    # own import of the app's module, no MLflow client (rank 0 has its own)
    assert warm[1]["ppid"] == warm[0]["pid"]
    assert warm[1]["torch_before"] and warm[1]["parts_imported_in"] == warm[1]["pid"]
    assert warm[1]["mlflow_clients_built"] == 0 and warm[0]["mlflow_clients_built"] > 0
    # job 1: Lightning's own Popen, and why, once
    assert cold[1]["ppid"] == cold[0]["pid"] and not cold[1]["torch_before"]
    assert cold[1]["mlflow_clients_built"] == 0
    log = (tmp_path / "sweep" / "1" / "warm_rank_app.log").read_text()
    assert log.count("this job's DDP ranks start as new interpreters") == 1
    assert "thread(s) that Python did not start" in log
    assert "new interpreters" not in (tmp_path / "sweep" / "0" / "warm_rank_app.log").read_text()
    # the reference: the app alone, no furcate, a single run
    (tmp_path / "alone").mkdir()
    alone = run_cli(APPS / "warm_rank_app.py", "hydra.run.dir=run", cwd=tmp_path / "alone")
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-4000:]
    theirs = torch.load(tmp_path / "alone" / "weights.pt")
    for num in (0, 1):
        mine = torch.load(tmp_path / "sweep" / str(num) / "weights.pt")
        assert all(torch.equal(mine[name], theirs[name]) for name in theirs), num
