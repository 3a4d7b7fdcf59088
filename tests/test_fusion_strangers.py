"""Nothing but a group's own members gets into a fused group's rendezvous, and nothing a
stranger sends is unpickled: another user's process, a process of the same user that is not a
job of the sweep, a job without the group's secret, and a member killed mid-handshake are each
refused (logged once), while the group forms from its members as it would have. A follower
checks its leader the same way.

Every participant is a real process: members are forked from this test's process, as jobs are
from their fork server (siblings); strangers are another uid (``nobody``, set in a forked child:
tests run as root), a grandchild of this process, or a sibling that does not hold the secret.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from furcate_hydra.fusion.rendezvous import (
    LEADER,
    SOCKET,
    Leading,
    RendezvousError,
    join,
    left,
)
from tests.process_helpers import wait_for
from tests.store_helpers import job_runs
from tests.test_fused_trials import APP, FURCATE

FORK = multiprocessing.get_context("fork")
SECRET = b"the group's key, as the launcher hands it down"
NOBODY = 65534


class WritesAFile:
    """What a stranger sends: a pickle that, once loaded, writes ``path`` (code run as the
    sweep's user)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"echo written > {self.path}",))


def member(directory: Path, key: str, size: int, results: Any, log_path: Path) -> None:
    """A member's process: join; the leader tells each follower who is in the group."""
    handler = logging.FileHandler(log_path)
    logging.getLogger("furcate_hydra").addHandler(handler)
    logging.getLogger("furcate_hydra").setLevel(logging.INFO)
    try:
        role = join(directory, key, size, {"key": key}, timeout_s=60, secret=SECRET)
    except RendezvousError as exc:
        results.put(("refused", key, str(exc)))
        return
    if isinstance(role, Leading):
        keys = [m.key for m in role.members]
        for joined in role.members:
            role.send(joined.key, ("you are", joined.key, "of", keys))
        results.put(("leader", key, keys))
        role.close()
    else:
        results.put(("follower", key, role.receive(timeout_s=60)))


def _send_pickle(sock: socket.socket, marker: Path) -> None:
    """Send the file-writing pickle every way a reader might load it (as long as the other
    end keeps the line open)."""
    try:
        Connection(os.dup(sock.fileno())).send_bytes(pickle.dumps(WritesAFile(marker)))
        sock.sendall(pickle.dumps(WritesAFile(marker)))
    except (BrokenPipeError, ConnectionResetError):
        pass


def _flushed(results: Any) -> None:
    """Before an ``os._exit`` or a kill: what was put on ``results`` is on its way."""
    results.close()
    results.join_thread()


def _connect(directory_fd: int) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(f"/proc/self/fd/{directory_fd}/{SOCKET}")
    return client


def _what_came_back(sock: socket.socket) -> int:
    """Bytes the other end sent before it closed the line (or 5 s passed)."""
    sock.settimeout(5)
    total = 0
    try:
        while chunk := sock.recv(65536):
            total += len(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return total


def other_user(directory_fd: int, marker: Path, results: Any, opened: int) -> None:
    """``nobody``: first through the directory as it is (0700), then, once ``opened`` says
    the test opened a door in its permissions, to the leader's own check of who connects."""
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    try:
        _connect(directory_fd)
        results.put("nobody reached the socket through a 0700 directory")
        return
    except PermissionError:
        pass
    results.put("blocked by the directory")
    os.read(opened, 1)  # the test opened the directory and the socket to everyone
    for _ in range(2):  # a second try is not logged again
        with _connect(directory_fd) as client:
            _send_pickle(client, marker)
            results.put(f"got {_what_came_back(client)} bytes back")


def not_a_job(directory_fd: int, marker: Path, results: Any) -> None:
    """The same user, but not a job of the sweep: a process this test's child started (its
    parent is not the members' parent)."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        for _ in range(2):
            with _connect(directory_fd) as client:
                _send_pickle(client, marker)
                results.put(f"got {_what_came_back(client)} bytes back")
        _flushed(results)
    finally:
        os._exit(0)


def without_the_secret(directory_fd: int, marker: Path, results: Any) -> None:
    """A job of the sweep (a sibling of the members) that does not hold the group's secret:
    it takes the challenge and answers with the pickle, then with a guess of the right size."""
    for answer in (pickle.dumps(WritesAFile(marker)), b"\0" * 64):
        with _connect(directory_fd) as client:
            line = Connection(os.dup(client.fileno()))
            challenge = line.recv_bytes()
            line.send_bytes(answer)
            came = _what_came_back(client)
            results.put(f"challenged with {len(challenge)} bytes, got {came} more")


def killed_mid_handshake(directory_fd: int, marker: Path, results: Any) -> None:
    """A member whose process is killed after the leader's challenge, before it answers."""
    client = _connect(directory_fd)
    Connection(os.dup(client.fileno())).recv_bytes()
    results.put("challenged, then killed")
    _flushed(results)
    os.kill(os.getpid(), 9)


STRANGERS: dict[str, Callable[..., None]] = {
    "another user": other_user,
    "not a job of the sweep": not_a_job,
    "a job without the secret": without_the_secret,
    "a member killed mid-handshake": killed_mid_handshake,
}


@pytest.mark.parametrize("stranger", list(STRANGERS))
def test_a_stranger_is_refused_and_the_group_forms_as_it_would_have(
    tmp_path: Path, stranger: str
) -> None:
    directory = tmp_path / "group-0"
    directory.mkdir(mode=0o700)
    marker, log_path = tmp_path / "written", tmp_path / "leader.log"
    results, strange = FORK.Queue(), FORK.Queue()
    leader = FORK.Process(target=member, args=(directory, "job0", 3, results, log_path))
    leader.start()
    while not (directory / SOCKET).exists():
        time.sleep(0.01)
    early = FORK.Process(target=member, args=(directory, "job1", 3, results, tmp_path / "1.log"))
    early.start()

    directory_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    opened_r, opened_w = os.pipe()
    args = (directory_fd, marker, strange) + ((opened_r,) if stranger == "another user" else ())
    intruder = FORK.Process(target=STRANGERS[stranger], args=args)
    intruder.start()
    said = []
    if stranger == "another user":
        said.append(strange.get(timeout=30))
        # open a door in the permissions: the leader's own check is what stops it now
        directory.chmod(0o711)
        (directory / SOCKET).chmod(0o777)
        os.write(opened_w, b"x")
    intruder.join(timeout=60)
    for fd in (directory_fd, opened_r, opened_w):
        os.close(fd)
    while not strange.empty():
        said.append(strange.get(timeout=5))
    directory.chmod(0o700)

    if stranger == "a member killed mid-handshake":
        left(directory, "job2")  # its job ended: the launcher says so
        expected = ["job0", "job1"]
    else:
        late = FORK.Process(target=member, args=(directory, "job2", 3, results, tmp_path / "2.log"))
        late.start()
        late.join(timeout=60)
        expected = ["job0", "job1", "job2"]
    got = [results.get(timeout=60) for _ in expected]
    for process in (leader, early):
        process.join(timeout=30)
        assert process.exitcode == 0

    assert not marker.exists(), "the stranger's pickle was loaded"
    (leading,) = [g for g in got if g[0] == "leader"]
    assert leading[2] == expected
    for _, key, message in (g for g in got if g[0] == "follower"):
        assert message == ("you are", key, "of", expected)
    logged = log_path.read_text()
    refusals = logged.count("a connection to the group's leader was refused")
    if stranger == "another user":
        assert said[0] == "blocked by the directory"
        assert said[1:] == ["got 0 bytes back"] * 2  # refused before a byte was read or sent
        assert refusals == 1 and f"runs as uid {NOBODY}" in logged
    elif stranger == "not a job of the sweep":
        assert said == ["got 0 bytes back"] * 2
        assert refusals == 1 and "is not a job of this sweep" in logged
    elif stranger == "a job without the secret":
        # the challenge, and nothing after it: neither answer opened the line
        assert said == ["challenged with 32 bytes, got 0 more"] * 2
        assert refusals == 1, logged
    else:
        assert said == ["challenged, then killed"]
        assert refusals == 0 and "a connection to the group's leader was dropped" in logged


def fake_leader(directory: Path, results: Any) -> None:
    """What listens as the group's leader (its mark, its socket) without being it: it takes
    the member's answer to its challenge, sends a wrong proof, and counts what follows."""
    (directory / LEADER).write_text(str(os.getpid()))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(directory / SOCKET))
        server.listen()
        server.settimeout(30)
        accepted, _ = server.accept()
        line = Connection(os.dup(accepted.fileno()))
        try:
            line.send_bytes(b"\1" * 32)
            answer = line.recv_bytes()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            results.put("the member closed the line at once")
            return
        line.send_bytes(b"\2" * 32)  # not HMAC(secret, ...): it does not hold the secret
        results.put(f"answered with {len(answer)} bytes, then {_what_came_back(accepted)} more")


def a_process_not_of_the_sweep(directory: Path, results: Any) -> None:
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        fake_leader(directory, results)
        _flushed(results)
    finally:
        os._exit(0)


@pytest.mark.parametrize("impostor", ["not a job of the sweep", "a job without the secret"])
def test_a_follower_sends_nothing_to_what_is_not_its_leader(tmp_path: Path, impostor: str) -> None:
    directory = tmp_path / "group-0"
    directory.mkdir(mode=0o700)
    results, heard = FORK.Queue(), FORK.Queue()
    target = a_process_not_of_the_sweep if impostor == "not a job of the sweep" else fake_leader
    listening = FORK.Process(target=target, args=(directory, heard))
    listening.start()
    while not (directory / SOCKET).exists():
        time.sleep(0.01)
    follower = FORK.Process(target=member, args=(directory, "job1", 2, results, tmp_path / "f.log"))
    follower.start()
    kind, key, why = results.get(timeout=60)
    follower.join(timeout=30)
    assert (kind, key) == ("refused", "job1")
    if impostor == "not a job of the sweep":
        assert "what listens for the group is not its leader" in why
        assert "is not a job of this sweep" in why
        # checked by the kernel's word on the connection: not a byte was sent on it
        assert heard.get(timeout=30) == "the member closed the line at once"
    else:
        assert "does not hold the group's secret" in why
        # its answer to the challenge (nonce + proof), and not a byte of its payload after
        assert heard.get(timeout=30) == "answered with 64 bytes, then 0 more"
    listening.join(timeout=30)


def test_a_group_directory_open_to_other_users_is_not_joined(tmp_path: Path) -> None:
    directory = tmp_path / "group-0"
    directory.mkdir(mode=0o755)
    with pytest.raises(RendezvousError, match=r"open to other users .*mode 755"):
        join(directory, "job0", 2, None, timeout_s=1, secret=SECRET)
    assert not (directory / LEADER).exists()


def test_the_socket_is_a_file_only_its_user_may_use(tmp_path: Path) -> None:
    directory = tmp_path / "group-0"
    directory.mkdir(mode=0o700)
    seen: Any = FORK.Queue()

    def look() -> None:
        while not (directory / SOCKET).exists():
            time.sleep(0.01)
        mode = (directory / SOCKET).stat().st_mode
        seen.put((stat.S_ISSOCK(mode), stat.S_IMODE(mode)))
        left(directory, "job1")

    watcher = FORK.Process(target=look)
    watcher.start()
    leading = join(directory, "job0", 2, None, timeout_s=30, secret=SECRET)
    watcher.join(timeout=30)
    assert isinstance(leading, Leading)
    assert seen.get(timeout=5) == (True, 0o600)
    assert not (directory / SOCKET).exists()  # gone once the group gathered


def test_strangers_at_a_sweeps_rendezvous_are_refused_and_every_config_finishes(
    tmp_path: Path, mlflow_store: str
) -> None:
    """The real launcher's group, through the Hydra CLI: while its leader waits for a config
    that reaches its fit seconds after it, another user and a process of the same user that
    is not one of the sweep's jobs each connect and send a file-writing pickle."""
    temp = tmp_path / "temp"  # the launcher's temp dir, where its groups' directories go
    temp.mkdir(mode=0o700)
    command = [
        sys.executable, str(APP), "-m", FURCATE, "hydra.launcher.max_workers=1",
        "hydra.launcher.fuse=auto", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "fit_delay=0,8", "epochs=2",
    ]  # fmt: skip
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    pattern = f"furcate-fused-*/group-*/{SOCKET}"
    wait_for(lambda: any(temp.glob(pattern)), launcher, "the group's leader listened")
    (path,) = temp.glob(pattern)
    directory, marker, strange = path.parent, tmp_path / "written", FORK.Queue()
    directory_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    opened_r, opened_w = os.pipe()
    nobody = FORK.Process(target=other_user, args=(directory_fd, marker, strange, opened_r))
    nobody.start()
    assert strange.get(timeout=30) == "blocked by the directory"
    directory.chmod(0o711)  # a door in the permissions: the leader's check stops it now
    path.chmod(0o777)
    os.write(opened_w, b"x")
    nobody.join(timeout=30)
    directory.chmod(0o700)  # closed again before the late member checks it
    path.chmod(0o600)
    same_user = FORK.Process(target=not_a_job, args=(directory_fd, marker, strange))
    same_user.start()
    same_user.join(timeout=30)
    for fd in (directory_fd, opened_r, opened_w):
        os.close(fd)
    said = [strange.get(timeout=5) for _ in range(4)]
    printed, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, printed.decode()

    assert said == ["got 0 bytes back"] * 4
    assert not marker.exists(), "a stranger's pickle was loaded"
    runs = job_runs(mlflow_store)
    assert [r.info.status for r in runs] == ["FINISHED"] * 2
    job_logs = [p.read_text() for p in sorted((tmp_path / "sweep").glob("*/stdout.log"))]
    assert len(job_logs) == 2
    for log in job_logs:  # each config trained in the group, as without strangers
        assert "furcate: fused: trained with 2 member(s) in one process" in log, log
    logs = "".join(job_logs)
    assert logs.count("a connection to the group's leader was refused") == 2, logs  # once each
    assert f"runs as uid {NOBODY}" in logs and "is not a job of this sweep" in logs
