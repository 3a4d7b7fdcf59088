"""A damaged sqlite store stops the sweep before anything is written into it, in one line.

Real damage to real files: bytes that were never a database, a store cut short, a recorded
store with pages overwritten in the middle (sqlite's own ``integrity_check`` confirms the
damage first, so no test passes on a file that is sound). Each kind is checked in this process
(``sqlite_damage``), and through the real CLI, which must name the file, the problem and the
fix in one line, print no traceback, run no job and leave the file as it was.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from furcate_hydra import sqlite_health
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.sqlite_health import sqlite_damage
from furcate_hydra.tuning.storage import check_sqlite_storage
from tests.conftest import run_optuna_study, run_probe_sweep
from tests.sweeper_helpers import ran_jobs

PAGE = 4096  # MLflow's stores use sqlite's default page size
CODE = (".py", ".pyc", ".so")  # what an import opens


@pytest.fixture(scope="module")
def recorded_store(tmp_path_factory: pytest.TempPathFactory, empty_mlflow_db: Path) -> Path:
    """A store with runs, params, metrics and tags, in WAL mode as the launcher leaves it."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("recorded")
    building = folder / "building.db"
    shutil.copyfile(empty_mlflow_db, building)
    client = MlflowClient(f"sqlite:///{building}")
    experiment = client.create_experiment("probe_app", artifact_location=str(folder / "mlruns"))
    for i in range(8):
        run = client.create_run(experiment, tags={"furcate.fingerprint": f"fp{i}" * 8})
        client.log_batch(
            run.info.run_id,
            params=[Param(f"model.p{k}", str(i * k)) for k in range(16)],
            metrics=[Metric(m, i / (s + 1), 0, s) for m in ("loss", "acc") for s in range(5)],
            tags=[RunTag("furcate.overrides", f"i={i}")],
        )
        client.set_terminated(run.info.run_id, "FINISHED")
    # MLflow writes in rollback mode, so the file holds every commit: copy it, then switch the
    # copy to WAL as the launcher does (no other connection has it open).
    store = folder / "mlflow.db"
    shutil.copyfile(building, store)
    with sqlite3.connect(store) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
    connection.close()
    return store


@contextmanager
def files_opened() -> Iterator[list[str]]:
    """The files the block opens, as a file or as a sqlite database, by any call path: Python's
    audit events (PEP 578) tell every open. Modules imported meanwhile are left out."""
    opened: list[str] = []
    watching = [True]  # an audit hook cannot be removed: it goes quiet after the block

    def hook(event: str, args: tuple[object, ...]) -> None:
        name = str(args[0]) if args else ""
        if watching[0] and event in ("open", "sqlite3.connect") and not name.endswith(CODE):
            opened.append(f"{event} {name}")

    sys.addaudithook(hook)
    try:
        yield opened
    finally:
        watching[0] = False


def integrity_problems(path: Path) -> str:
    """sqlite's ``integrity_check`` of the file, read-only: "ok" or what it reports."""
    try:
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            rows = connection.execute("PRAGMA integrity_check").fetchall()
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return " ".join(str(row[0]) for row in rows)


def garbage(path: Path, store: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64)


def header_cut_short(path: Path, store: Path) -> None:
    path.write_bytes(store.read_bytes()[:60])


def cut_in_half(path: Path, store: Path) -> None:
    data = store.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def pages_overwritten(path: Path, store: Path) -> None:
    """Three pages in the middle of the file overwritten, as a bad disk or a stray write
    would leave them; sqlite's full integrity check must see it."""
    data = bytearray(store.read_bytes())
    middle = (len(data) // PAGE // 2) * PAGE
    data[middle : middle + 3 * PAGE] = b"\xa5" * (3 * PAGE)
    path.write_bytes(bytes(data))
    assert integrity_problems(path) != "ok"


Damage = Callable[[Path, Path], None]


@pytest.mark.parametrize(
    ("damage", "problem", "readable"),
    [
        (garbage, "is not a sqlite database (it does not begin with sqlite's header", False),
        (header_cut_short, "is cut short: 60 bytes, less than sqlite's 100-byte header", False),
        (cut_in_half, "is cut short (", True),
        (pages_overwritten, "is damaged: PRAGMA quick_check reports", True),
    ],
)
def test_each_kind_of_damage_is_named_with_its_fix(
    tmp_path: Path, recorded_store: Path, damage: Damage, problem: str, readable: bool
) -> None:
    path = tmp_path / "mlflow.db"
    damage(path, recorded_store)
    found = sqlite_damage(path)
    assert found is not None
    assert found.problem.startswith(f"the file {path} ") or found.problem.startswith(
        f"the sqlite file {path} "
    )
    assert problem in found.problem, found.problem
    assert found.readable is readable
    fix = found.fix(path)
    assert fix.startswith(f"restore {path} from a copy")
    assert (".recover" in fix) is readable
    assert "\n" not in found.problem + fix


def test_text_in_place_of_a_database_is_shown(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    path.write_text("version https://git-lfs.github.com/spec/v1\n")  # an LFS pointer
    found = sqlite_damage(path)
    assert found is not None and found.problem.endswith(", but with 'version https://')")


def test_sound_absent_and_empty_files_pass(tmp_path: Path, recorded_store: Path) -> None:
    assert integrity_problems(recorded_store) == "ok"
    assert sqlite_damage(recorded_store) is None
    assert sqlite_damage(tmp_path / "absent.db") is None
    (tmp_path / "empty.db").touch()  # sqlite makes a new database in an empty file
    assert sqlite_damage(tmp_path / "empty.db") is None


def test_a_store_locked_by_another_writer_is_not_called_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "busy.db"
    with sqlite3.connect(path) as writer:
        writer.execute("CREATE TABLE t (x)")
    writer.isolation_level = None
    writer.execute("BEGIN EXCLUSIVE")  # rollback journal: readers wait for this writer
    monkeypatch.setattr(sqlite_health, "BUSY_TIMEOUT_S", 0.1)
    try:
        assert sqlite_damage(path) is None
    finally:
        writer.close()


def test_the_fix_recovers_a_store_that_mlflow_reads(tmp_path: Path, recorded_store: Path) -> None:
    """The fix's own command, run as given; where this sqlite shell cannot ``.recover`` (built
    without the sqlite_dbpage table, as Debian 12's is), README's ``.dump`` way instead."""
    from mlflow.tracking import MlflowClient

    if shutil.which("sqlite3") is None:
        pytest.skip("no sqlite3 shell here")
    path = tmp_path / "mlflow.db"
    pages_overwritten(path, recorded_store)
    found = sqlite_damage(path)
    assert found is not None
    command = found.fix(path).split("`")[1]
    recovered = tmp_path / "mlflow-recovered.db"
    assert str(recovered) in command
    ran = subprocess.run(command, shell=True, capture_output=True, text=True)
    if ran.returncode != 0 or not recovered.exists() or recovered.stat().st_size == 0:
        recovered.unlink(missing_ok=True)
        source, _, target = command.partition(" .recover | ")
        commit = "sed '$s/^ROLLBACK; -- due to errors$/COMMIT;/'"
        dump = f"{source} .dump | {commit} | {target}"
        subprocess.run(dump, shell=True, capture_output=True, text=True, check=True)
    assert sqlite_damage(recovered) is None
    client = MlflowClient(f"sqlite:///{recovered}")
    experiment = client.get_experiment_by_name("probe_app")
    assert experiment is not None
    assert client.search_runs([experiment.experiment_id], max_results=100)


@pytest.mark.parametrize("damage", [garbage, cut_in_half, pages_overwritten])
def test_the_sweep_stops_in_one_line_and_writes_nothing(
    tmp_path: Path, recorded_store: Path, damage: Damage
) -> None:
    path = tmp_path / "mlflow.db"
    damage(path, recorded_store)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    uri = f"sqlite:///{path}"
    result = run_probe_sweep(tmp_path, "+i=0,1", env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = [line for line in result.stderr.splitlines() if "Invalid MLFLOW_TRACKING_URI=" in line]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert f"Invalid MLFLOW_TRACKING_URI={uri!r}: the " in line
    assert f" file {path} is " in line and "nothing was written to it. Fix: restore" in line
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert not ran_jobs(tmp_path / "sweep")


@pytest.mark.usefixtures("mlflow_store")
def test_a_damaged_optuna_storage_stops_the_sweep_before_any_trial(tmp_path: Path) -> None:
    path = tmp_path / "optuna.db"  # the sweeper's default storage, sqlite:///optuna.db
    path.write_bytes(b"\x00" * 8192)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    result = run_optuna_study(tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    expected = f"Invalid hydra.sweeper.storage='sqlite:///{path}': the file {path} is not a sqlite"
    assert expected in result.stderr, result.stderr
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert not ran_jobs(tmp_path / "sweep")


@pytest.mark.parametrize(
    "url", ["postgresql://u@db/optuna", "sqlite:///:memory:", "sqlite://", "not a url"]
)
def test_storages_without_a_file_are_not_checked(url: str) -> None:
    with files_opened() as opened:
        check_sqlite_storage(url, "hydra.sweeper.storage")
    assert opened == []


def test_a_damaged_sqlite_storage_is_named_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "optuna.db"
    path.write_bytes(b"\x00" * 200)
    url = f"sqlite:///{path}"
    with pytest.raises(FurcateConfigError) as raised:
        check_sqlite_storage(url, "hydra.sweeper.storage")
    assert raised.value.key == "hydra.sweeper.storage" and raised.value.value == url
    assert str(path) in raised.value.problem and "Fix: restore" in str(raised.value)
