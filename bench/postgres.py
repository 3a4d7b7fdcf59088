"""A PostgreSQL server of the bench's own, on a loopback port, and an ``mlflow server`` in
front of a database.

    Cluster(folder) ──► initdb (once: a folder kept under bench/results/ keeps its databases)
                    ──► start() on a free 127.0.0.1 port ──► url(db) ──► stop() (pg_ctl stop)
    mlflow_server(backend_url, artifacts) ──► http://127.0.0.1:<port> ──► stopped on exit

``initdb`` and the server refuse root: run as root, they run as ``user`` (``postgres``, Debian's
package's user). Nothing listens beyond 127.0.0.1 and the socket dir in ``folder``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Cluster", "free_port", "mlflow_server", "pg_bin"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def pg_bin() -> Path | None:
    """The directory of PostgreSQL's server programs, or None."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return versions[-1].parent if versions else None


class Cluster:
    """A PostgreSQL cluster in ``folder`` (made on first use), served while started.

    Args:
        folder: Holds the data dir, the socket and the log; kept between runs if it is kept.
        user: Who runs ``initdb`` and the server when this process is root.
        settings: ``-c`` settings for the server, e.g. ``{"fsync": "off"}`` while building.

    Raises:
        RuntimeError: PostgreSQL is not installed, or one of its programs failed.
    """

    def __init__(self, folder: Path, user: str = "postgres", **settings: str) -> None:
        binaries = pg_bin()
        if binaries is None:
            raise RuntimeError("no pg_ctl: install PostgreSQL (apt-get install postgresql)")
        self.bin, self.folder, self.settings = binaries, folder, settings
        self.as_user = ["runuser", "-u", user, "--"] if os.geteuid() == 0 else []
        self.data = folder / "pgdata"
        self.port = 0
        folder.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(folder, user)
            # a temp dir (0700) above the folder: the server's user must pass through it
            folder.parent.chmod(folder.parent.stat().st_mode | 0o111)
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "bench", "-E", "UTF8")

    def _run(self, program: str, *args: str) -> str:
        command = [*self.as_user, str(self.bin / program), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def start(self) -> None:
        self.port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder}"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        log = str(self.folder / "log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        if self.port:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.port = 0

    def psql(self, database: str, sql: str) -> str:
        """Run ``sql`` in ``database``; its output, unaligned, without headers."""
        return self._run(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "bench", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-At", "-c", sql,
        )  # fmt: skip

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        self.psql("postgres", f'CREATE DATABASE "{name}"')
        return self.url(name)

    def databases(self) -> set[str]:
        return set(self.psql("postgres", "SELECT datname FROM pg_database").split())

    def url(self, database: str) -> str:
        # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3: name the driver installed
        return f"postgresql+psycopg2://bench@127.0.0.1:{self.port}/{database}"

    @contextlib.contextmanager
    def running(self) -> Iterator[Cluster]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


@contextlib.contextmanager
def mlflow_server(backend_url: str, artifacts: Path, log: Path) -> Iterator[str]:
    """``mlflow server`` on a free loopback port in front of ``backend_url``; its address.
    Stopped (its process group, by its pid) on exit."""
    port = free_port()
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", backend_url,
        "--default-artifact-root", str(artifacts),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{address}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: see {log}")
            time.sleep(0.5)
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
