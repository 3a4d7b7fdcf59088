"""A new sqlite MLflow store in milliseconds: MLflow's own schema, made once per MLflow version
and copied into place.

    creating_store (the schema lock held) ──► no file yet ──► seed_new_store(path)
        the template of this MLflow version, in the user's cache ──► a copy, renamed into place
        none yet ──► MLflow makes its tables in a temp file (its own migrations, up to its
                     alembic version row), which becomes the template

MLflow takes ~1.7 s to create a store's tables (it runs every schema migration since its first),
paid by the first sweep in each new directory before its first job. A copy of the tables it
made once is the same file, alembic's version row included, so MLflow opens it as its own: it
finds every table at its head revision and makes only what depends on the store's place, the
Default experiment and its artifact location. A store that exists is never touched (one made
by another MLflow version opens and migrates as MLflow does), nor is anything but a sqlite
file. Best effort: where the template cannot be made or copied, MLflow creates the store as
it always did.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes
from furcate_hydra.sqlite_lock import creating_sqlite_schema

__all__ = ["CACHE_VAR", "seed_new_store", "template_path"]

log = logging.getLogger(__name__)

# where the templates are kept: this variable, else $XDG_CACHE_HOME/furcate-hydra, else
# ~/.cache/furcate-hydra
CACHE_VAR = "FURCATE_CACHE_DIR"


def template_path() -> Path:
    """The template of the installed MLflow's store (it may not exist yet)."""
    import mlflow

    cache = os.environ.get(CACHE_VAR)
    if cache:
        root = Path(cache)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "furcate-hydra"
    return root / "mlflow-stores" / f"mlflow-{mlflow.__version__}.db"


def seed_new_store(database: Path) -> bool:
    """Put a copy of MLflow's empty store at ``database`` if no store is there yet; whether it
    did. Call it holding the schema lock (``creating_sqlite_schema``): no other furcate
    process creates the file meanwhile."""
    if database.exists() and database.stat().st_size > 0:
        return False
    try:
        template = _template()
        _copy_into_place(template, database)
    except Exception as exc:  # MLflow creates it, as it always did
        log.debug("furcate: no template for the new MLflow store %s: %r", database, exc)
        return False
    return True


def _template() -> Path:
    """The template, made now if it is not there (one process at a time)."""
    path = template_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with creating_sqlite_schema(path):  # the template is a sqlite file whose schema is made
        if not path.exists():  # another process made it while this one waited
            _make_template(path)
    return path


def _make_template(path: Path) -> None:
    """MLflow's tables, made by MLflow in a temp file beside ``path``, then renamed to it."""
    import sqlalchemy
    from mlflow.store.db import utils

    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".making-") as tmp:
        made = Path(tmp) / "mlflow.db"
        engine = sqlalchemy.create_engine(f"sqlite:///{made}")
        try:
            # MLflow's migrations, as a new store runs them
            utils._initialize_tables(engine)  # type: ignore[no-untyped-call]
            utils._verify_schema(engine)  # type: ignore[no-untyped-call]  # at its head, or raises
        finally:
            engine.dispose()
        os.replace(made, path)


def _copy_into_place(template: Path, database: Path) -> None:
    """A copy of ``template`` at ``database``, whole or not at all, with the mode a new file
    gets (an empty store is a few hundred KB: read whole)."""
    atomic_write_bytes(database, template.read_bytes(), durable=False)
