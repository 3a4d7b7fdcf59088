"""The warm fork server driven through its protocol, as the slot pool drives it."""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import replace
from pathlib import Path

import cloudpickle
import psutil

from furcate_hydra.execution.forkserver.client import ForkServerClient
from furcate_hydra.execution.forkserver.protocol import (
    ChildReport,
    Exited,
    Placement,
    Start,
    Started,
)
from tests.fork_server_tasks import DetachingContext, WarmingContext


def _start(tmp_path: Path, key: str) -> Start:
    return Start(
        key=key,
        payload=key.encode(),
        env={},
        placement=Placement(slot=0, env={}, cpus=None, threads=None),
        stdout_path=str(tmp_path / f"{key}.out"),
        stderr_path=str(tmp_path / f"{key}.err"),
        result_path=str(tmp_path / f"{key}.result"),
        echo=False,
    )


def _until(client: ForkServerClient, seen: list[object], kind: type, key: str) -> object:
    """The server's message of ``kind`` about ``key``, among those ``seen`` or still to come."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for message in seen:
            if isinstance(message, kind) and getattr(message, "key", None) == key:
                return message
        message = client.receive(timeout=1.0)
        if message is not None:
            seen.append(message)
    raise AssertionError(f"no {kind.__name__} for {key} in {seen}")


def test_a_job_starts_while_an_ended_jobs_output_is_still_held_open(tmp_path: Path) -> None:
    # The first job has exited, but a process it left holds its output open: the server still
    # reads it. The second job, forked meanwhile on the slot the first freed, must keep every
    # pipe of its own. The server once passed the first job's closed process handle on as
    # still its own, and the second job closed whatever of its own got that number: its
    # stderr here, where a free number below (a descriptor the server closed) shifts them.
    context = DetachingContext(hold_s=3.0, hold="low")
    client = ForkServerClient([], cloudpickle.dumps(context))
    seen: list[object] = []
    try:
        client.wait_ready()
        client.start(_start(tmp_path, "first"))
        started = _until(client, seen, Started, "first")
        assert isinstance(started, Started)
        while psutil.pid_exists(started.pid):  # exited and reaped, its output still open
            time.sleep(0.02)
        time.sleep(0.3)  # the server has seen it exit
        client.set_context(cloudpickle.dumps(DetachingContext(hold_s=0.0, release="low")))
        client.start(_start(tmp_path, "second"))
        exited = _until(client, seen, Exited, "second")
        assert isinstance(exited, Exited)
        errors = (tmp_path / "second.err").read_text()
        assert os.waitstatus_to_exitcode(exited.wait_status) == 0, errors
        report = pickle.loads((tmp_path / "second.result").read_bytes())
        assert isinstance(report, ChildReport) and report.value == "second", errors
        assert isinstance(_until(client, seen, Exited, "first"), Exited)
    finally:
        client.terminate()


def test_each_job_inherits_what_the_server_warmed_before_forking_it(tmp_path: Path) -> None:
    client = ForkServerClient([], cloudpickle.dumps(WarmingContext()))
    seen: list[object] = []
    try:
        client.wait_ready()
        for key in ("first", "second"):
            client.start(replace(_start(tmp_path, key), env={"WARM": key}))
            exited = _until(client, seen, Exited, key)
            assert isinstance(exited, Exited)
        values = [
            pickle.loads((tmp_path / f"{key}.result").read_bytes()).value
            for key in ("first", "second")
        ]
        assert values == ["first", "first,second"]
    finally:
        client.terminate()
