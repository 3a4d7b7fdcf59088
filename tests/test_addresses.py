"""Store URLs and HOST:PORT addresses, each parsed by one type."""

from __future__ import annotations

from pathlib import Path

import pytest

from furcate_hydra.addresses import HostPort, StoreAddress
from furcate_hydra.errors import FurcateConfigError

KEY = "hydra.launcher.mlflow.tracking_uri"


@pytest.mark.parametrize(
    "url, scheme, path, query",
    [
        ("sqlite:///mlflow.db", "sqlite", "mlflow.db", ""),
        ("sqlite:///runs/mlflow.db", "sqlite", "runs/mlflow.db", ""),
        ("sqlite:////abs/mlflow.db", "sqlite", "/abs/mlflow.db", ""),
        (
            "sqlite:////abs/mlflow.db?mode=ro&uri=true",
            "sqlite",
            "/abs/mlflow.db",
            "mode=ro&uri=true",
        ),
        ("sqlite:///optuna.db?timeout=20", "sqlite", "optuna.db", "timeout=20"),
        ("sqlite+pysqlite:///o.db", "sqlite", "o.db", ""),
        ("SQLite:///o.db", "sqlite", "o.db", ""),
        ("sqlite:///:memory:", "sqlite", None, ""),
        ("sqlite://", "sqlite", None, ""),
        ("postgresql+psycopg2://u:p@db/optuna?sslmode=require", "postgresql", None, ""),
        ("http://127.0.0.1:5000", "http", None, ""),
        ("https://mlflow.example.org/", "https", None, ""),
        ("databricks", "", None, ""),
        ("mlflow.db", "", None, ""),
        ("/abs/path:with/colon", "", None, ""),
    ],
)
def test_a_store_url_is_split_once(url: str, scheme: str, path: str | None, query: str) -> None:
    address = StoreAddress.parse(url).checked(KEY)
    assert address.scheme == scheme
    assert address.sqlite_path == (None if path is None else Path(path))
    assert address.query == query
    assert address.in_memory == (scheme == "sqlite" and path is None)


@pytest.mark.parametrize(
    "url, problem",
    [
        ("sqlite://mlflow.db", "names a host"),
        ("sqlite://host/mlflow.db", "names a host"),
        ("sqlite:/mlflow.db", "is no sqlite URL"),
        ("sqlite:mlflow.db", "is no sqlite URL"),
    ],
)
def test_a_malformed_sqlite_url_is_named_with_its_fix(url: str, problem: str) -> None:
    address = StoreAddress.parse(url)  # asking never fails
    assert address.is_sqlite and address.sqlite_path is None
    with pytest.raises(FurcateConfigError) as raised:
        address.checked(KEY)
    message = str(raised.value)
    assert message.startswith(f"Invalid {KEY}={url!r}: {problem}")
    assert "Fix: give sqlite:///mlflow.db" in message and "sqlite:////abs/path.db" in message


@pytest.mark.parametrize(
    "url, made",
    [
        ("sqlite:///mlflow.db", "sqlite:///{cwd}/mlflow.db"),
        ("sqlite:///runs/o.db?timeout=20", "sqlite:///{cwd}/runs/o.db?timeout=20"),
        ("sqlite+pysqlite:///o.db", "sqlite+pysqlite:///{cwd}/o.db"),
        ("sqlite:////abs/o.db?mode=ro", "sqlite:////abs/o.db?mode=ro"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite://", "sqlite://"),
        ("postgresql://h/db", "postgresql://h/db"),
        ("http://h:5000", "http://h:5000"),
    ],
)
def test_a_relative_sqlite_file_is_made_absolute_keeping_its_query(
    url: str, made: str, tmp_path: Path
) -> None:
    absolute = StoreAddress.parse(url).absolute(tmp_path)
    assert absolute.url == made.format(cwd=tmp_path)
    assert absolute == StoreAddress.parse(absolute.url)


def test_resolve_follows_dot_dot_and_links(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    address = StoreAddress.parse("sqlite:///link/../link/o.db?timeout=5")
    assert address.absolute(tmp_path).url == f"sqlite:///{tmp_path}/link/../link/o.db?timeout=5"
    resolved = address.absolute(tmp_path, resolve=True)
    assert resolved.url == f"sqlite:///{tmp_path.resolve()}/real/o.db?timeout=5"


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("10.0.0.5:6379", "10.0.0.5", 6379),
        ("head-node:1", "head-node", 1),
        ("h:65535", "h", 65535),
        ("[::1]:13000", "::1", 13000),
        ("fe80::1:6379", "fe80::1", 6379),  # the last colon separates the port
    ],
)
def test_host_and_port(text: str, host: str, port: int) -> None:
    for optional in (False, True):
        if optional and text.count(":") > 1 and not text.startswith("["):
            continue  # a bare IPv6 address where the port may be left out: see below
        assert HostPort.parse(text, "k", "fix", port_optional=optional) == HostPort(host, port)


@pytest.mark.parametrize(
    "text, host",
    [("10.0.0.5", "10.0.0.5"), ("::1", "::1"), ("fe80::1:6379", "fe80::1:6379"), ("[::1]", "::1")],
)
def test_a_host_alone_takes_any_free_port_where_the_port_may_be_left_out(
    text: str, host: str
) -> None:
    assert HostPort.parse(text, "k", "fix", port_optional=True) == HostPort(host, 0)


@pytest.mark.parametrize(
    "value, optional, problem",
    [
        ("head-node", False, "must be HOST:PORT, with a port from 1 to 65535"),
        ("h:0", False, "with a port from 1 to 65535"),
        ("h:0", True, "must be HOST:PORT or HOST (any free port), with a port from 1 to 65535"),
        ("h:65536", False, "with a port from 1 to 65535"),
        ("h:", True, "with a port from 1 to 65535"),
        ("h:http", False, "with a port from 1 to 65535"),
        (":6379", False, "must be HOST:PORT"),
        ("", True, "must be HOST:PORT or HOST (any free port)"),
        ("http://h:80", False, "must be HOST:PORT"),
        ("a b:1", False, "must be HOST:PORT"),
        ("[::1]x", True, "must be HOST:PORT or HOST"),
        (6379, False, "must be HOST:PORT"),
        (None, True, "must be HOST:PORT or HOST"),
    ],
)
def test_a_bad_host_and_port_is_named_with_its_fix(
    value: object, optional: bool, problem: str
) -> None:
    with pytest.raises(FurcateConfigError) as raised:
        HostPort.parse(
            value, "hydra.x.address", "set hydra.x.address=10.0.0.5:6379", port_optional=optional
        )
    message = str(raised.value)
    assert message.startswith(f"Invalid hydra.x.address={value!r}: must be HOST:PORT")
    assert problem in message
    assert message.endswith("Fix: set hydra.x.address=10.0.0.5:6379.")


def test_host_and_port_print_as_they_are_written() -> None:
    assert str(HostPort("10.0.0.5", 6379)) == "10.0.0.5:6379"
    assert str(HostPort("::1", 13000)) == "[::1]:13000"
