"""A member's line to its group's leader, sealed: both ends prove they hold the group's
secret before anything else is read, and every message carries a MAC that is checked before a
byte of it is unpickled.

    leader ── nonce L (32 bytes) ─────────────────────────────► member
    leader ◄── nonce M + HMAC(secret, "member" L M) ──────────── member   the leader checks it
    leader ── HMAC(secret, "leader" L M) ─────────────────────► member   the member checks it
    then each message: HMAC(line key, sender, count, body) + body,
                       line key = HMAC(secret, "line" L M)

The handshake's messages have fixed sizes and are read with that bound, each within a timeout:
a peer without the secret makes its reader take at most 64 bytes and wait at most
``timeout_s`` before it is dropped, and nothing it sends is ever unpickled. Fresh nonces on
both sides and a count per direction mean that no message of another line can be replayed,
and none of this one dropped or reordered, unseen.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import secrets
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

__all__ = ["LineRefused", "SealedLine", "seal_as_leader", "seal_as_member"]

_NONCE = 32
_TAG = hashlib.sha256().digest_size


class LineRefused(Exception):
    """The other end did not prove it holds the group's secret, or a message's seal is wrong."""


def _tag(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


class SealedLine:
    """Messages over ``connection``, each sealed with the line's key and its count."""

    def __init__(self, connection: Connection, key: bytes, leads: bool) -> None:
        self.connection = connection
        self._key = key
        self._mine, self._theirs = (b"leader", b"member") if leads else (b"member", b"leader")
        self._sent = 0
        self._received = 0

    def send(self, message: Any) -> None:
        # cloudpickle: a class of the app's script (``__main__.TinyMLP``) travels by value, as
        # the job's process may run the script under another name than the leader's __main__.
        # Not the connection's pickler: torch's reductions for multiprocessing would share a
        # tensor's storage by passing a file descriptor, which the sender must stay alive to
        # hand over; a copy of the bytes needs nothing of it
        body = cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        seal = _tag(self._key, self._mine, self._sent.to_bytes(8, "big"), body)
        self.connection.send_bytes(seal + body)
        self._sent += 1

    def receive(self) -> Any:
        """The next message, unpickled once its seal is checked.

        Raises:
            EOFError: the other end closed the line (its process ended).
            LineRefused: the message was not sealed with this line's key, or not the next one.
        """
        data = self.connection.recv_bytes()
        seal, body = data[:_TAG], data[_TAG:]
        expected = _tag(self._key, self._theirs, self._received.to_bytes(8, "big"), body)
        if not hmac.compare_digest(seal, expected):
            raise LineRefused(f"message {self._received} on the line has a wrong seal")
        self._received += 1
        return pickle.loads(body)

    def poll(self, timeout_s: float) -> bool:
        return self.connection.poll(timeout_s)

    def close(self) -> None:
        self.connection.close()


def _read(connection: Connection, size: int, timeout_s: float, what: str) -> bytes:
    if not connection.poll(timeout_s):
        raise LineRefused(f"no {what} within {timeout_s:g} s")
    try:
        data = connection.recv_bytes(size)
    except OSError:  # longer than any handshake message: not a member's
        raise LineRefused(f"a {what} longer than {size} bytes") from None
    if len(data) != size:
        raise LineRefused(f"a {what} of {len(data)} bytes, not {size}")
    return data


def seal_as_leader(connection: Connection, secret: bytes, timeout_s: float) -> SealedLine:
    """The leader's end of a new line: the member must prove it holds ``secret`` first.

    Raises:
        LineRefused: it did not, in ``timeout_s``.
        EOFError: it closed the line (its process ended mid-handshake).
    """
    ours = secrets.token_bytes(_NONCE)
    connection.send_bytes(ours)
    answer = _read(connection, _NONCE + _TAG, timeout_s, "answer to the leader's challenge")
    theirs, proof = answer[:_NONCE], answer[_NONCE:]
    if not hmac.compare_digest(proof, _tag(secret, b"member", ours, theirs)):
        raise LineRefused("the peer does not hold the group's secret")
    connection.send_bytes(_tag(secret, b"leader", ours, theirs))
    return SealedLine(connection, _tag(secret, b"line", ours, theirs), leads=True)


def seal_as_member(connection: Connection, secret: bytes, timeout_s: float) -> SealedLine:
    """A member's end of a new line: it proves it holds ``secret``, and so must the leader.

    Raises:
        LineRefused: the leader did not, in ``timeout_s``.
        EOFError: the leader closed the line.
    """
    leaders = _read(connection, _NONCE, timeout_s, "challenge from the leader")
    ours = secrets.token_bytes(_NONCE)
    connection.send_bytes(ours + _tag(secret, b"member", leaders, ours))
    proof = _read(connection, _TAG, timeout_s, "proof from the leader")
    if not hmac.compare_digest(proof, _tag(secret, b"leader", leaders, ours)):
        raise LineRefused("the group's leader does not hold the group's secret")
    return SealedLine(connection, _tag(secret, b"line", leaders, ours), leads=False)
