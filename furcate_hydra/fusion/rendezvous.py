"""The members of a fused group find each other: the processes of the jobs placed together
on one slot, each at its ``fit``.

The group's directory is the launcher's (one per set of jobs placed together, with how many
they are); its first member to arrive leads: it creates ``leader`` exclusively, listens on a
Unix socket named after the directory (in Linux's abstract namespace: a sweep dir's path may
be longer than a socket path can be) and waits until every member has joined or left. A
member leaves before joining when its job ends without reaching ``fit`` (the launcher writes
``left-<key>`` for it), so no leader waits for a job that is gone; one that takes longer than
the leader waits finds the group ``closed`` and runs alone. Each joining member sends
what it brings (its payload) and then takes its instructions from the leader over its
connection.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import cloudpickle
import psutil

from furcate_hydra import env_vars

LEADER = "leader"
CLOSED = "closed"  # the leader gathered its members: a later one runs alone
log = logging.getLogger(__name__)
_POLL_S = 0.05


def _address(directory: Path) -> str:
    digest = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:24]
    return f"\0furcate-fusion-{digest}"


class RendezvousError(RuntimeError):
    """The group could not form: the text names what is missing."""


@dataclass
class Joined:
    """A member as the leader sees it: its key, what it brought, its line (None: the leader)."""

    key: str
    payload: Any
    connection: Connection | None


@dataclass
class Leading:
    """This process leads: every member that joined, itself first."""

    members: list[Joined]

    def send(self, key: str, message: Any) -> None:
        """Send member ``key`` its message; one whose process ended gets nothing (its job's
        end is the launcher's to record)."""
        for member in self.members:
            if member.key == key and member.connection is not None:
                try:
                    _send(member.connection, message)
                except OSError:
                    log.info("furcate: fused member %s ended before its end was sent", key)

    def ask(self, key: str, message: Any) -> Any:
        """Send member ``key`` a question and wait for its answer.

        Raises:
            RendezvousError: the member's process ended.
        """
        for member in self.members:
            if member.key == key and member.connection is not None:
                try:
                    _send(member.connection, message)
                    return _receive(member.connection)
                except (OSError, EOFError):
                    raise RendezvousError(f"member {key} ended before it answered") from None
        raise RendezvousError(f"member {key} has no line to the leader")

    def close(self) -> None:
        for member in self.members:
            if member.connection is not None:
                member.connection.close()


@dataclass
class Following:
    """This process follows: its line to the leader."""

    connection: Connection

    def receive(self, timeout_s: float | None = None) -> Any:
        if timeout_s is not None and not self.connection.poll(timeout_s):
            raise RendezvousError(f"the group's leader said nothing for {timeout_s:.0f} s")
        try:
            return _receive(self.connection)
        except EOFError:
            raise RendezvousError("the group's leader is gone (its process ended)") from None

    def send(self, message: Any) -> None:
        _send(self.connection, message)


def _send(connection: Connection, message: Any) -> None:
    # cloudpickle: a class of the app's script (``__main__.TinyMLP``) travels by value, as the
    # job's process may run the script under another name than the leader's __main__. Not
    # the connection's pickler: torch's reductions for multiprocessing would share
    # a tensor's storage by passing a file descriptor, which the sender must stay alive to
    # hand over; a copy of the bytes needs nothing of it
    connection.send_bytes(cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(connection: Connection) -> Any:
    return pickle.loads(connection.recv_bytes())


def left(directory: Path, key: str) -> None:
    """Say that member ``key`` will not join (its job ended before its ``fit``); the launcher
    writes it (``execution.fused_groups``), and tests."""
    (directory / f"{env_vars.FUSE_LEFT}{key}").touch()


def join(
    directory: Path, key: str, size: int, payload: Any, timeout_s: float
) -> Leading | Following:
    """Join the group of ``size`` members in ``directory``: lead it, or follow its leader."""
    try:
        mark = os.open(directory / LEADER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return _follow(directory, key, payload, timeout_s)
    os.write(mark, str(os.getpid()).encode())
    os.close(mark)
    return _lead(directory, key, size, payload, timeout_s)


def _lead(directory: Path, key: str, size: int, payload: Any, timeout_s: float) -> Leading:
    """Gather the members until all joined or left; after ``timeout_s``, go on with those
    that joined (a late one finds the group closed and runs alone)."""
    members = [Joined(key, payload, None)]
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(_address(directory))
        server.listen()
        server.settimeout(_POLL_S)
        while len(members) + _gone(directory, members) < size:
            if time.monotonic() > deadline:
                missing = size - len(members) - _gone(directory, members)
                log.warning(
                    "furcate: %d of %d members of the fused group did not reach their fit in "
                    "%.0f s; training the %d that did",
                    missing,
                    size,
                    timeout_s,
                    len(members),
                )
                break
            try:
                accepted, _ = server.accept()
            except TimeoutError:
                continue
            accepted.settimeout(None)
            connection = Connection(accepted.detach())
            try:
                their_key, their_payload = _receive(connection)
            except Exception as exc:  # a member gone mid-send, or what no member sends
                log.info("furcate: fused: a connection to the group's leader was dropped (%s)", exc)
                connection.close()
                continue
            members.append(Joined(their_key, their_payload, connection))
        (directory / CLOSED).touch()  # before the socket closes: no one joins after this
    return Leading(members)


def _leader_pid(directory: Path) -> int | None:
    """The pid the leader wrote into its mark (None until it has)."""
    try:
        return int((directory / LEADER).read_text() or "0") or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a process that exited and is not yet reaped does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _gone(directory: Path, joined: list[Joined]) -> int:
    """Members whose job ended without joining (one that joined and then ended counts once)."""
    keys = {member.key for member in joined}
    prefix = env_vars.FUSE_LEFT
    return sum(1 for path in directory.glob(f"{prefix}*") if path.name[len(prefix) :] not in keys)


def _follow(directory: Path, key: str, payload: Any, timeout_s: float) -> Following:
    deadline = time.monotonic() + timeout_s
    while True:
        if (directory / CLOSED).exists():
            raise RendezvousError("the group's leader had stopped waiting for members")
        leader = _leader_pid(directory)
        if leader is not None and not _alive(leader):
            raise RendezvousError(f"the group's leader (pid {leader}) is gone")
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(_address(directory))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            client.close()
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"no leader of the group in {directory} listened in {timeout_s:.0f} s"
                ) from None
            time.sleep(_POLL_S)
    connection = Connection(client.detach())
    _send(connection, (key, payload))
    return Following(connection)
