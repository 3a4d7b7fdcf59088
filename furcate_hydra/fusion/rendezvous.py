"""The members of a fused group find each other: the processes of the jobs placed together
on one slot, each at its ``fit``.

The group's directory is the launcher's (one per set of jobs placed together, with how many
they are), of mode 0700: only the sweep's user reaches it. Its first member to arrive leads:
it creates ``leader`` exclusively, listens on the Unix socket ``rendezvous`` there, and waits
until every member has joined or left. A member leaves before joining when its job ends
without reaching ``fit`` (the launcher writes ``left-<key>`` for it), so no leader waits for a
job that is gone; one that takes longer than the leader waits finds the group ``closed`` and
runs alone. Each joining member sends what it brings (its payload) and then takes its
instructions from the leader over its line.

Nothing arrives from a stranger: a connection is read only when the kernel says its process
is one of the sweep's jobs (``fusion.peers``), and its line only once it proved it holds the
group's secret, which the launcher hands each member through the fork server, never through
the environment (``fusion.sealed_line``). A follower checks its leader the same way. A refused
connection is logged once and changes nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from furcate_hydra import env_vars
from furcate_hydra.fusion.peers import peer_pid, peer_refusal
from furcate_hydra.fusion.sealed_line import (
    LineRefused,
    SealedLine,
    seal_as_leader,
    seal_as_member,
)
from furcate_hydra.said_once import SaidOnce

LEADER = "leader"
CLOSED = "closed"  # the leader gathered its members: a later one runs alone
SOCKET = "rendezvous"
log = logging.getLogger(__name__)
_POLL_S = 0.05
# How long one side of a new line waits for the other's part of the handshake: a member's
# answer takes microseconds, so this only bounds how long a connection that never answers
# (a member killed mid-handshake) holds up the gathering
_HANDSHAKE_S = 10.0


class RendezvousError(RuntimeError):
    """The group could not form: the text names what is missing."""


@dataclass
class Joined:
    """A member as the leader sees it: its key, what it brought, its line (None: the leader)."""

    key: str
    payload: Any
    connection: SealedLine | None


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
                    member.connection.send(message)
                except OSError:
                    log.info("furcate: fused member %s ended before its end was sent", key)

    def ask(self, key: str, message: Any) -> Any:
        """Send member ``key`` a question and wait for its answer.

        Raises:
            RendezvousError: the member's process ended, or its answer was not sealed.
        """
        for member in self.members:
            if member.key == key and member.connection is not None:
                try:
                    member.connection.send(message)
                    return member.connection.receive()
                except (OSError, EOFError):
                    raise RendezvousError(f"member {key} ended before it answered") from None
                except LineRefused as exc:
                    raise RendezvousError(f"member {key}'s answer was refused: {exc}") from None
        raise RendezvousError(f"member {key} has no line to the leader")

    def close(self) -> None:
        for member in self.members:
            if member.connection is not None:
                member.connection.close()


@dataclass
class Following:
    """This process follows: its line to the leader."""

    connection: SealedLine

    def receive(self, timeout_s: float | None = None) -> Any:
        if timeout_s is not None and not self.connection.poll(timeout_s):
            raise RendezvousError(f"the group's leader said nothing for {timeout_s:.0f} s")
        try:
            return self.connection.receive()
        except EOFError:
            raise RendezvousError("the group's leader is gone (its process ended)") from None
        except LineRefused as exc:
            raise RendezvousError(f"a message from the group's leader was refused: {exc}") from None

    def send(self, message: Any) -> None:
        self.connection.send(message)


def left(directory: Path, key: str) -> None:
    """Say that member ``key`` will not join (its job ended before its ``fit``); the launcher
    writes it (``execution.fused_groups``), and tests."""
    (directory / f"{env_vars.FUSE_LEFT}{key}").touch()


def join(
    directory: Path, key: str, size: int, payload: Any, timeout_s: float, secret: bytes
) -> Leading | Following:
    """Join the group of ``size`` members in ``directory``: lead it, or follow its leader.
    ``secret``: the group's, as the launcher handed it to each member.

    Raises:
        RendezvousError: the group cannot form (its directory is open to other users, its
            leader is gone or not the group's, ...): this member runs alone.
    """
    _check_private(directory)
    try:
        mark = os.open(directory / LEADER, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return _follow(directory, key, payload, timeout_s, secret)
    os.write(mark, str(os.getpid()).encode())
    os.close(mark)
    return _lead(directory, key, size, payload, timeout_s, secret)


def _check_private(directory: Path) -> None:
    """The group's directory is this user's alone: its socket and marks are out of reach of
    every other user."""
    try:
        info = directory.stat()
    except OSError as exc:
        raise RendezvousError(f"the group's directory {directory} cannot be read ({exc})") from None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise RendezvousError(
            f"the group's directory {directory} is open to other users (owner uid "
            f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; it must be this user's, 700)"
        )


@contextlib.contextmanager
def _socket_path(directory: Path, name: str = SOCKET) -> Iterator[str]:
    """The path of socket ``name`` in ``directory``, short whatever the directory's: through
    an open handle on it (a Unix socket's path holds at most 107 bytes; a temp dir's may be
    longer)."""
    handle = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{handle}/{name}"
    finally:
        os.close(handle)


class _Refusals:
    """Connections refused while a group gathers: each peer's logged once."""

    def __init__(self) -> None:
        self._said = SaidOnce()

    def refuse(self, pid: int, why: str) -> None:
        if self._said.first(pid):
            log.warning("furcate: fused: a connection to the group's leader was refused: %s", why)


def _lead(
    directory: Path, key: str, size: int, payload: Any, timeout_s: float, secret: bytes
) -> Leading:
    """Gather the members until all joined or left; after ``timeout_s``, go on with those
    that joined (a late one finds the group closed and runs alone)."""
    members = [Joined(key, payload, None)]
    refusals = _Refusals()
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        # bound under another name, and named the group's socket once only its user may use it
        unready = f".{SOCKET}-{os.getpid()}"
        with _socket_path(directory, unready) as path:
            server.bind(path)
        os.chmod(directory / unready, 0o600)
        os.rename(directory / unready, directory / SOCKET)
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
            joined = _admit(accepted, secret, refusals)
            if joined is not None:
                members.append(joined)
        (directory / CLOSED).touch()  # before the socket closes: no one joins after this
    (directory / SOCKET).unlink(missing_ok=True)
    return Leading(members)


def _admit(accepted: socket.socket, secret: bytes, refusals: _Refusals) -> Joined | None:
    """The member at the other end of a new connection, or None (refused, or gone)."""
    pid = peer_pid(accepted)
    why = peer_refusal(accepted)
    if why is not None:
        accepted.close()
        refusals.refuse(pid, why)
        return None
    accepted.settimeout(None)
    connection = Connection(accepted.detach())
    try:
        line = seal_as_leader(connection, secret, _HANDSHAKE_S)
        their_key, their_payload = line.receive()
    except LineRefused as exc:
        connection.close()
        refusals.refuse(pid, f"pid {pid}: {exc}")
        return None
    except Exception as exc:  # a member gone mid-handshake or mid-send
        connection.close()
        log.info("furcate: fused: a connection to the group's leader was dropped (%r)", exc)
        return None
    return Joined(their_key, their_payload, line)


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


def _connected(directory: Path) -> socket.socket | None:
    """A connection to the group's socket, or None while nothing listens there."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _socket_path(directory) as path:
            client.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        client.close()
        return None
    return client


def _follow(directory: Path, key: str, payload: Any, timeout_s: float, secret: bytes) -> Following:
    deadline = time.monotonic() + timeout_s
    while True:
        if (directory / CLOSED).exists():
            raise RendezvousError("the group's leader had stopped waiting for members")
        leader = _leader_pid(directory)
        if leader is not None and not _alive(leader):
            raise RendezvousError(f"the group's leader (pid {leader}) is gone")
        # until its mark is written there is no pid to check an answer by
        client = None if leader is None else _connected(directory)
        if client is not None:
            break
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"no leader of the group in {directory} listened in {timeout_s:.0f} s"
            )
        time.sleep(_POLL_S)
    why = peer_refusal(client, expected_pid=leader)
    if why is not None:
        client.close()
        raise RendezvousError(f"what listens for the group is not its leader: {why}")
    connection = Connection(client.detach())
    try:
        line = seal_as_member(connection, secret, _HANDSHAKE_S)
        line.send((key, payload))
    except LineRefused as exc:
        connection.close()
        raise RendezvousError(f"the group's leader was refused: {exc}") from None
    except (EOFError, OSError) as exc:
        connection.close()
        raise RendezvousError(f"the group's leader dropped this member ({exc!r})") from None
    return Following(line)
