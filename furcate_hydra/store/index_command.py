"""``furcate index [--drop]``: make or drop furcate's indexes on a store's database."""

from __future__ import annotations

from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.store.store_index import create_indexes, drop_indexes, store_indexes
from furcate_hydra.store.tracking_uri import TrackingUri

__all__ = ["run_index"]


def run_index(tracking: TrackingUri, drop: bool = False) -> str:
    """Make (or drop) the indexes on ``tracking``'s database; a line saying what was done.

    Raises:
        FurcateConfigError: Naming the store's setting, when it is no sqlite or PostgreSQL
            database furcate can index (an MLflow server, a file that is not there).
    """
    import sqlalchemy as sa

    address = tracking.address
    path = tracking.sqlite_path
    if path is not None and not path.is_file():
        raise FurcateConfigError(
            tracking.source, tracking.uri, "no such sqlite file", "point it at the store's file"
        )
    if address.scheme in ("http", "https", "databricks", "file", ""):
        raise FurcateConfigError(
            tracking.source,
            tracking.uri,
            "it is no database: furcate indexes the database an MLflow server stores into",
            "pass --tracking-uri the server's --backend-store-uri (e.g. postgresql://...)",
        )
    engine = sa.create_engine(tracking.uri)
    try:
        try:
            store_indexes(engine.dialect.name)
        except ValueError as exc:
            raise FurcateConfigError(
                tracking.source, tracking.uri, str(exc), "use a sqlite or PostgreSQL store"
            ) from None
        if drop:
            names = drop_indexes(engine)
            return f"dropped {', '.join(names)}" if names else "no furcate index to drop"
        names = create_indexes(engine)
        return f"made {', '.join(names)}" if names else "furcate's indexes are there already"
    finally:
        engine.dispose()
