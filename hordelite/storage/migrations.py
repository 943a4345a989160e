"""Versioned schema migrations, run at start (and by ``hordelite db upgrade``).

``MIGRATIONS[i]`` takes a database from version i to i + 1 inside one
transaction. A database from an older release keeps its data: a schema
change is a new function appended here, never an edit of an old one.

schema.py always holds the latest schema, and version 1 creates whatever
tables of it are missing. So a new database gets the latest schema from
version 1 and then runs every later migration too: each later migration
must therefore also be correct on a database that already has its change
(drop-if-exists then create, add a column only when inspect() lacks it).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, func, insert, inspect, select, update

from hordelite.storage import schema


def _v1(conn: Connection) -> None:
    # The first schema: every table as defined in schema.py at version 1.
    schema.metadata.create_all(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    # ix_queue_order in the pop's order (prio_key descending): with every
    # column ascending, the pop sorted a model's whole queue for each pop.
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_queue_order")
    conn.exec_driver_sql(
        "CREATE INDEX ix_queue_order ON queue (model, anonymous, prio_key DESC, created)"
    )


MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2]
LATEST = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("schema_version"):
        return 0
    version = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(version or 0)


def upgrade(conn: Connection) -> tuple[int, int]:
    """Apply every pending migration; returns (version before, version after)."""
    if conn.dialect.name == "postgresql":
        # Replicas starting together: one migrates, the others wait for it.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7001)")
    before = current_version(conn)
    if before > LATEST:
        raise RuntimeError(
            f"the database is at schema version {before}, newer than this hordelite ({LATEST})"
        )
    for version in range(before, LATEST):
        MIGRATIONS[version](conn)
    if before == 0:
        conn.execute(insert(schema.schema_version).values(version=LATEST))
    elif before < LATEST:
        conn.execute(update(schema.schema_version).values(version=LATEST))
    return before, LATEST
