"""Addresses parsed once into a type: a store's URL and a ``HOST:PORT``.

    "sqlite:///runs/mlflow.db?timeout=20" ─► StoreAddress: sqlite, file runs/mlflow.db,
                                             query timeout=20
    "10.0.0.5:6379", "[::1]:13000"       ─► HostPort("10.0.0.5", 6379), HostPort("::1", 13000)

A store URL is an MLflow tracking URI or an Optuna storage URL; both reach SQLAlchemy, whose
sqlite URLs are ``sqlite:///relative/path``, ``sqlite:////absolute/path`` (a driver may follow
the scheme: ``sqlite+pysqlite:///…``) and ``sqlite://`` or ``sqlite:///:memory:`` in memory;
a ``?`` starts the driver's options, never part of the file's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from furcate_hydra.errors import FurcateConfigError

__all__ = ["SQLITE_EXAMPLE", "HostPort", "StoreAddress", "shown_url"]

SQLITE_EXAMPLE = "sqlite:///mlflow.db (relative to the working directory) or sqlite:////abs/path.db"
_MEMORY = ":memory:"
_PORTS = range(1, 65536)


def shown_url(url: str) -> str:
    """``url`` for a log line or a message: a password in it shown as ``***`` (a log file
    in the sweep dir is often readable by the machine's other users)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL a password could be read from
        return url
    if not password:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


@dataclass(frozen=True)
class StoreAddress:
    """A store URL, split once: its scheme (without a driver), and for sqlite its file.

    ``parse`` never fails, so that code which only asks (is it sqlite? which file?) needs no
    error handling; ``checked`` refuses a malformed sqlite URL where a setting is read.

    Attributes:
        url: the text as given.
        scheme: lower-case, without ``+driver`` (``sqlite``, ``postgresql``, ``http``…);
            empty for text with no ``scheme:`` (MLflow's bare ``databricks``, a path).
        database: for sqlite, what follows ``sqlite:///`` up to ``?`` (empty or
            ``:memory:`` in memory); empty for other schemes.
        query: for sqlite, what follows ``?``, without it; empty when there is none.
        problem: why a sqlite URL is malformed; empty when it is not.
    """

    url: str
    scheme: str
    database: str = ""
    query: str = ""
    problem: str = ""

    @classmethod
    def parse(cls, url: str) -> StoreAddress:
        head, colon, rest = url.partition(":")
        if not colon or not head.replace("+", "").replace("-", "").isalnum():
            return cls(url, "")
        scheme = head.split("+")[0].lower()
        if scheme != "sqlite":
            return cls(url, scheme)
        location, _, query = rest.partition("?")
        if location.startswith("///"):
            return cls(url, scheme, location[3:], query)
        if location == "//":
            return cls(url, scheme, "", query)
        problem = (
            "names a host, so SQLAlchemy opens a store in memory, one per process"
            if location.startswith("//")
            else "is no sqlite URL (sqlite:/// and a path)"
        )
        return cls(url, scheme, "", query, problem)

    def checked(self, key: str) -> StoreAddress:
        """This address, unless it is a malformed sqlite URL; ``key`` names the setting.

        Raises:
            FurcateConfigError: a sqlite URL that names a host (``sqlite://x.db``) or has
                one slash (``sqlite:/x.db``).
        """
        if self.problem:
            raise FurcateConfigError(key, self.url, self.problem, f"give {SQLITE_EXAMPLE}")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.scheme == "sqlite"

    @property
    def in_memory(self) -> bool:
        """A sqlite store in this process's memory (or a malformed sqlite URL): no other
        process can open it."""
        return self.is_sqlite and self.database in ("", _MEMORY)

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a sqlite store (as written: relative or absolute); None for another
        store and for sqlite in memory."""
        return None if not self.is_sqlite or self.in_memory else Path(self.database)

    def absolute(self, cwd: Path, *, resolve: bool = False) -> StoreAddress:
        """This address with a relative sqlite file made absolute against ``cwd`` (its query
        kept; ``resolve``: links and ``..`` resolved too). Any other address is unchanged."""
        path = self.sqlite_path
        if path is None or path.is_absolute():
            return self
        full = (cwd / path).resolve() if resolve else cwd / path
        head = self.url.partition(":")[0]
        url = f"{head}:///{full}" + (f"?{self.query}" if self.query else "")
        return replace(self, url=url, database=str(full))


@dataclass(frozen=True)
class HostPort:
    """A ``HOST:PORT`` address; port 0 (only when it may be left out) means any free one."""

    host: str
    port: int

    @classmethod
    def parse(cls, value: object, key: str, fix: str, *, port_optional: bool = False) -> HostPort:
        """``HOST:PORT``, ``[IPV6]:PORT``; with ``port_optional`` also ``HOST`` or a bare
        IPv6 address (port 0). The last ``:`` separates the port; a port is 1 to 65535.

        Raises:
            FurcateConfigError: naming ``key``, the value, what is allowed, and ``fix``.
        """
        text = value if isinstance(value, str) else ""
        host, sep, port = text, "", ""
        if text.startswith("["):  # [IPV6] or [IPV6]:PORT
            inside, bracket, after = text[1:].partition("]")
            host = inside if bracket and after[:1] in ("", ":") else ""
            sep, port = after[:1], after[1:]
        elif ":" in text and not (port_optional and text.count(":") > 1):  # not a bare IPv6
            host, sep, port = text.rpartition(":")
        allowed = "HOST:PORT or HOST (any free port)" if port_optional else "HOST:PORT"
        if not host or any(c in "/[]" or c.isspace() for c in host):
            raise FurcateConfigError(key, value, f"must be {allowed}", fix)
        if not sep and port_optional:
            return cls(host, 0)
        if not port.isdigit() or int(port) not in _PORTS:
            problem = f"must be {allowed}, with a port from 1 to 65535"
            raise FurcateConfigError(key, value, problem, fix)
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
