"""Which store a sweep records into, the check that it answers before any job starts, and a
fresh sqlite store created by several processes at once."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store import TrackingUri, check_tracking_uri, resolve_tracking_uri
from furcate_hydra.store.tracking_uri import DEFAULT_TRACKING_URI, ENV_KEY, URI_KEY
from tests.conftest import REPO
from tests.test_store_server import free_port


@pytest.mark.parametrize(
    ("configured", "environ", "uri", "source"),
    [
        ("sqlite:////cfg/a.db", {ENV_KEY: "sqlite:////env/b.db"}, "sqlite:////cfg/a.db", URI_KEY),
        (None, {ENV_KEY: "sqlite:////env/b.db"}, "sqlite:////env/b.db", ENV_KEY),
        ("", {ENV_KEY: "http://host:5000"}, "http://host:5000", ENV_KEY),
        (None, {ENV_KEY: ""}, "sqlite:////home/me/project/mlflow.db", URI_KEY),
        (None, {}, "sqlite:////home/me/project/mlflow.db", URI_KEY),
        ("sqlite:///rel/x.db", {}, "sqlite:////home/me/project/rel/x.db", URI_KEY),
        ("sqlite:///x.db?timeout=20", {}, "sqlite:////home/me/project/x.db?timeout=20", URI_KEY),
        ("sqlite://x.db", {}, "sqlite://x.db", URI_KEY),  # malformed: the check names it
        (None, {ENV_KEY: "sqlite:///x.db"}, "sqlite:////home/me/project/x.db", ENV_KEY),
        ("sqlite:///:memory:", {}, "sqlite:///:memory:", URI_KEY),
        ("sqlite://", {}, "sqlite://", URI_KEY),
        ("postgresql://u@db/mlflow", {}, "postgresql://u@db/mlflow", URI_KEY),
    ],
)
def test_resolve_precedence_and_absolute_sqlite_paths(
    configured: str | None, environ: dict[str, str], uri: str, source: str
) -> None:
    resolved = resolve_tracking_uri(configured, environ, Path("/home/me/project"))
    assert resolved == TrackingUri(uri, source)


def test_resolve_reads_the_process_environment_and_cwd_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_KEY, "sqlite:///env.db")
    assert resolve_tracking_uri(None) == TrackingUri(f"sqlite:///{tmp_path}/env.db", ENV_KEY)
    monkeypatch.delenv(ENV_KEY)
    assert resolve_tracking_uri(None).uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"


def config_error(tracking: TrackingUri, timeout_s: float = 5.0) -> FurcateConfigError:
    with pytest.raises(FurcateConfigError) as error:
        check_tracking_uri(tracking, timeout_s)
    assert error.value.key == tracking.source
    assert error.value.value == tracking.uri
    message = str(error.value)
    assert f"Invalid {tracking.source}={tracking.uri!r}" in message and "Fix:" in message
    return error.value


@pytest.mark.parametrize("uri", ["sqlite:///:memory:", "sqlite://"])
def test_in_memory_sqlite_is_refused(uri: str) -> None:
    assert "in-memory" in config_error(TrackingUri(uri, URI_KEY)).problem


def test_sqlite_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/missing/mlflow.db"
    error = config_error(TrackingUri(uri, ENV_KEY))
    assert f"the folder {tmp_path}/missing does not exist" in error.problem


def test_sqlite_in_an_existing_folder_is_accepted(tmp_path: Path) -> None:
    check_tracking_uri(TrackingUri(f"sqlite:///{tmp_path}/new.db", URI_KEY))
    assert not (tmp_path / "new.db").exists()  # checking creates nothing


def test_a_damaged_sqlite_store_is_refused_naming_the_file(tmp_path: Path) -> None:
    # every kind of damage, and the CLI's report of it: tests/test_damaged_stores.py
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"<html>not a store</html>" * 10)
    error = config_error(TrackingUri(f"sqlite:///{path}", ENV_KEY))
    assert error.problem.startswith(f"the file {path} is not a sqlite database")
    assert error.problem.endswith("; nothing was written to it")
    assert error.fix.startswith(f"restore {path} from a copy")


def test_a_sqlite_urls_options_are_not_part_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"<html>not a store</html>" * 10)
    tracking = TrackingUri(f"sqlite:///{path}?timeout=20", ENV_KEY)
    assert tracking.sqlite_path == path
    assert config_error(tracking).problem.startswith(f"the file {path} is not a sqlite database")


@pytest.mark.parametrize("uri", ["sqlite://mlflow.db", "sqlite:/mlflow.db"])
def test_a_malformed_sqlite_url_is_refused_with_the_two_spellings(uri: str) -> None:
    assert "sqlite:///mlflow.db" in config_error(TrackingUri(uri, URI_KEY)).fix


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "ftp://host/x", "/tmp/mlruns", "mlruns"])
def test_stores_furcate_cannot_query_are_refused(uri: str) -> None:
    error = config_error(TrackingUri(uri, URI_KEY))
    assert "database-backed MLflow store" in error.problem


@pytest.mark.parametrize(
    "uri",
    ["postgresql://u@{at}/mlflow", "mysql+pymysql://u@{at}/m", "databricks", "databricks://p"],
)
def test_other_database_stores_are_not_contacted(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as listening:  # where each store's address points: it counts callers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        at = f"127.0.0.1:{listening.getsockname()[1]}"
        # Databricks's address comes from the environment, or from a profile's config file
        config = tmp_path / "databrickscfg"
        config.write_text(f"[p]\nhost = http://{at}\ntoken = t\n")
        monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(config))
        monkeypatch.setenv("DATABRICKS_HOST", f"http://{at}")
        monkeypatch.setenv("DATABRICKS_TOKEN", "t")
        check_tracking_uri(TrackingUri(uri.format(at=at), URI_KEY))
        listening.setblocking(False)
        with pytest.raises(BlockingIOError):  # a connection made would wait to be accepted
            listening.accept()


def test_a_closed_port_fails_fast() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    error = config_error(TrackingUri(uri, ENV_KEY))
    assert time.monotonic() - started < 10  # MLflow's own client would retry for minutes
    assert error.problem.startswith("no MLflow server answers there")
    assert "mlflow server" in error.fix


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as listening:  # accepts connections into its backlog, never replies
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        uri = f"http://127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        error = config_error(TrackingUri(uri, URI_KEY), timeout_s=0.5)
        assert time.monotonic() - started < 5
    assert "timed out" in error.problem


class Health(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's ``status``, remembering the paths asked for."""

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HealthServer)
        server.paths.append(self.path)
        self.send_response(server.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, format: str, *args: object) -> None:
        pass


class HealthServer(http.server.ThreadingHTTPServer):
    def __init__(self, status: int) -> None:
        super().__init__(("127.0.0.1", 0), Health)
        self.status = status
        self.paths: list[str] = []


@contextmanager
def health_server(status: int) -> Iterator[HealthServer]:
    server = HealthServer(status)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("suffix", ["", "/"])
def test_a_server_answering_health_is_accepted(suffix: str) -> None:
    with health_server(200) as server:
        check_tracking_uri(TrackingUri(f"http://127.0.0.1:{server.server_port}{suffix}", ENV_KEY))
    assert server.paths == ["/health"]


@pytest.mark.parametrize("status", [500, 404])
def test_a_server_answering_an_error_is_refused(status: int) -> None:
    with health_server(status) as server:
        uri = f"http://127.0.0.1:{server.server_port}"
        error = config_error(TrackingUri(uri, URI_KEY))
    assert error.problem == f"{uri}/health answered HTTP {status}"


CREATE_STORE = """
import sys, time
from pathlib import Path
from furcate_hydra.store import RunStore, resolve_tracking_uri

uri, ready, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
(ready / sys.argv[4]).touch()
while len(list(ready.iterdir())) < count:  # all imported: open the store together
    time.sleep(0.001)
store = RunStore(resolve_tracking_uri(uri), "exp", 10.0, 60.0, sqlite_wal=True)
store.close()
print(store.experiment_id)
"""


@pytest.mark.slow  # two fresh MLflow schemas, one after the other: ~25 s on 2 busy cores
def test_processes_creating_a_fresh_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    (tmp_path / "fresh").mkdir()
    ready = tmp_path / "ready"
    ready.mkdir()
    count = 2
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE_STORE, uri, str(ready), str(count), str(i)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    results = [p.communicate(timeout=120) for p in processes]
    for process, (_, stderr) in zip(processes, results, strict=True):
        assert process.returncode == 0, stderr
    assert len({stdout.strip() for stdout, _ in results}) == 1  # one experiment, found by all
