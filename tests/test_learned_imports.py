"""The fork server takes on what its jobs import: tried apart first, imported while it serves.

Driven through the server's own protocol, as the slot pool drives it. The modules are the
test's own, written into a directory on the server's path: one that imports, one that fails,
one that hangs, one that starts a thread, one that is not there; and pandas, an installed
package the server knows to import cleanly, which the test's context never imports.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import cloudpickle
import psutil
import pytest

from furcate_hydra.execution.forkserver.client import ForkServerClient
from furcate_hydra.execution.forkserver.job_imports import installed_imports
from furcate_hydra.execution.forkserver.protocol import (
    ChildReport,
    Exited,
    Imported,
    Placement,
    Preloaded,
    Start,
    Started,
)
from tests.fork_server_tasks import ImportsContext

MODULES = {
    "learned_good": "VALUE = 1\n",
    "learned_bad": "raise RuntimeError('learned_bad cannot be imported here')\n",
    "learned_slow": "import time\ntime.sleep(600)\n",
    "learned_thread": (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    ),
}
KNOWN = "pandas"  # installed with MLflow; imported without a probe
PLACE = Placement(slot=0, env={}, cpus=None, threads=None)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ForkServerClient]:
    """A server (a new interpreter) whose path has the test's modules, none imported."""
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [*MODULES, KNOWN]:
        assert name not in sys.modules or name == KNOWN
    client = ForkServerClient([], cloudpickle.dumps(ImportsContext()))
    client.wait_ready()
    yield client
    client.terminate()


def _start(
    tmp_path: Path, key: str, names: list[str], placed: bool = True, hold_s: float = 0.0
) -> Start:
    return Start(
        key=key,
        payload=json.dumps({"check": names, "hold_s": hold_s}).encode(),
        env={},
        placement=PLACE if placed else None,
        stdout_path=str(tmp_path / f"{key}.out"),
        stderr_path=str(tmp_path / f"{key}.err"),
        result_path=str(tmp_path / f"{key}.result"),
        echo=False,
    )


def _next(client: ForkServerClient, seen: list[object], kind: type, key: str | None) -> object:
    """The server's message of ``kind`` (about ``key``), among those seen or still to come."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for message in seen:
            if isinstance(message, kind) and (key is None or getattr(message, "key", "") == key):
                seen.remove(message)
                return message
        message = client.receive(timeout=0.5)
        if message is not None:
            seen.append(message)
    raise AssertionError(f"no {kind.__name__} for {key} in {seen}")


def _result(tmp_path: Path, key: str) -> tuple[list[str], int]:
    report = pickle.loads((tmp_path / f"{key}.result").read_bytes())
    assert isinstance(report, ChildReport) and report.error is None, report.error
    value: tuple[list[str], int] = report.value
    return value


def test_what_imports_cleanly_is_taken_on_and_the_rest_refused_with_why(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.preload([*MODULES, "learned_missing"], probe_limit_s=8.0)
    began = time.monotonic()
    # the probe hangs on learned_slow meanwhile: jobs are forked and run as ever
    server.start(_start(tmp_path, "during", [*MODULES]))
    assert isinstance(_next(server, seen, Exited, "during"), Exited)
    assert time.monotonic() - began < 6.0
    assert _result(tmp_path, "during") == ([], 0)

    done = _next(server, seen, Preloaded, None)
    assert isinstance(done, Preloaded)
    assert done.imported == ["learned_good"]
    assert "RuntimeError: learned_bad cannot be imported here" in done.refused["learned_bad"]
    assert done.refused["learned_slow"] == "its import was not done within 8 s"
    assert "starts a Python thread" in done.refused["learned_thread"]
    assert "ModuleNotFoundError" in done.refused["learned_missing"]
    assert set(done.refused) == {*MODULES, "learned_missing"} - {"learned_good"}

    server.start(_start(tmp_path, "after", [*MODULES]))
    assert isinstance(_next(server, seen, Exited, "after"), Exited)
    # only the good one in the server; the context was told once
    assert _result(tmp_path, "after") == (["learned_good"], 1)


def test_a_job_asked_while_the_server_imports_is_forked_with_the_import(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.preload([KNOWN])
    server.start(_start(tmp_path, "held", [KNOWN]))
    done = _next(server, seen, Preloaded, None)
    assert isinstance(done, Preloaded) and done.imported == [KNOWN] and not done.refused
    assert isinstance(_next(server, seen, Exited, "held"), Exited)
    assert _result(tmp_path, "held") == ([KNOWN], 1)


def test_jobs_waiting_ahead_are_forked_again_once_the_server_has_more(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.start(_start(tmp_path, "ahead", [KNOWN], placed=False))
    time.sleep(1.0)  # forked, set up, at its gate: without the import
    server.preload([KNOWN])
    assert isinstance(_next(server, seen, Preloaded, None), Preloaded)
    server.release(PLACE)
    started = _next(server, seen, Started, "ahead")
    exited = _next(server, seen, Exited, "ahead")
    assert isinstance(started, Started) and isinstance(exited, Exited)
    assert os.waitstatus_to_exitcode(exited.wait_status) == 0
    assert _result(tmp_path, "ahead") == ([KNOWN], 1)
    assert not [m for m in seen if isinstance(m, Exited)]  # the first fork is never reported


def test_a_round_that_brings_in_nothing_new_leaves_the_jobs_waiting_ahead_as_they_are(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.start(_start(tmp_path, "ahead", ["json"], placed=False))
    time.sleep(1.0)  # forked, set up, at its gate
    (waiting,) = psutil.Process(server.process.pid).children()
    server.preload(["json"])  # the server has it already
    done = _next(server, seen, Preloaded, None)
    assert isinstance(done, Preloaded) and done.imported == ["json"] and not done.refused
    server.release(PLACE)
    started = _next(server, seen, Started, "ahead")
    assert isinstance(started, Started) and started.pid == waiting.pid  # not forked again
    assert isinstance(_next(server, seen, Exited, "ahead"), Exited)
    assert _result(tmp_path, "ahead") == (["json"], 0)  # nor told of imports


def test_a_job_held_for_an_import_and_stopped_ends_as_killed(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.preload([KNOWN])
    server.start(_start(tmp_path, "stopped", [KNOWN]))
    server.kill("stopped", signal.SIGTERM)
    exited = _next(server, seen, Exited, "stopped")
    assert isinstance(exited, Exited) and exited.wait_status == signal.SIGTERM
    assert isinstance(_next(server, seen, Preloaded, None), Preloaded)
    assert not (tmp_path / "stopped.result").exists()
    server.start(replace(_start(tmp_path, "next", [KNOWN])))
    assert isinstance(_next(server, seen, Exited, "next"), Exited)
    assert _result(tmp_path, "next") == ([KNOWN], 1)


def test_a_running_job_says_which_heavy_packages_it_imported_as_soon_as_they_are_in(
    server: ForkServerClient, tmp_path: Path
) -> None:
    seen: list[object] = []
    server.start(_start(tmp_path, "importer", [KNOWN], hold_s=30.0))
    named: list[str] = []
    while KNOWN not in named:  # numpy, on pandas' way, is said first
        said = _next(server, seen, Imported, "importer")
        assert isinstance(said, Imported)
        named += said.modules
    assert named == ["numpy", KNOWN]
    assert not [m for m in seen if isinstance(m, Exited)]  # while it still runs
    server.kill("importer", signal.SIGKILL)
    assert isinstance(_next(server, seen, Exited, "importer"), Exited)


def test_a_job_names_the_installed_packages_it_imported_itself() -> None:
    importlib.import_module("pandas")  # as a job's task imports it (numpy on its way)

    found = installed_imports(set(sys.modules) - {"pandas", "numpy"})
    assert {"numpy", "pandas"} <= set(found)
    # the project's own modules, the tests' and the standard library's are never named
    every = installed_imports(set())
    assert "numpy" in every
    assert not {"furcate_hydra", "tests", "os", "json", "sys"} & set(every)


def test_a_server_stopped_while_a_probe_hangs_leaves_no_probe_behind(
    server: ForkServerClient,
) -> None:
    server.preload(["learned_slow", "learned_good"], probe_limit_s=300.0)
    deadline = time.monotonic() + 30
    server_process = psutil.Process(server.process.pid)
    while not (probes := server_process.children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(probes) == 1
    began = time.monotonic()
    server.shutdown(grace_s=1.0)
    assert time.monotonic() - began < 10.0
    assert not probes[0].is_running() or probes[0].status() == psutil.STATUS_ZOMBIE
