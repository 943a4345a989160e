"""Schema migrations on an empty database and on an up-to-date one."""

from __future__ import annotations

from sqlalchemy import Connection, func, inspect, select, update

from hordelite.storage import queries, schema
from hordelite.storage.database import Database
from hordelite.storage.migrations import LATEST, current_version, upgrade
from tests.storage.helpers import NOW, new_key_hash


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def _version_rows(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(schema.schema_version)).scalar_one())


def test_upgrade_on_an_empty_database_creates_every_table_and_reaches_the_latest_version(
    empty_database: Database,
) -> None:
    assert empty_database.run_sync(current_version, False) == 0

    before, after = empty_database.run_sync(upgrade, True)

    assert (before, after) == (0, LATEST)
    assert empty_database.run_sync(current_version, False) == LATEST
    assert empty_database.run_sync(_tables, False) >= set(schema.metadata.tables)


def test_a_second_upgrade_changes_nothing_and_keeps_the_data(empty_database: Database) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    user_id = db.run_sync(
        queries.create_user, True, "alice", new_key_hash(), 12.5, False, False, NOW
    )

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (LATEST, LATEST)
    assert db.run_sync(current_version, False) == LATEST
    assert db.run_sync(_version_rows, False) == 1
    user = db.run_sync(queries.user_by_id, False, user_id)
    assert user["username"] == "alice"
    assert user["kudos"] == 12.5


def _as_version_1(conn: Connection) -> None:
    """Put the database back in version 1's shape: ix_queue_order all ascending."""
    conn.exec_driver_sql("DROP INDEX ix_queue_order")
    conn.exec_driver_sql(
        "CREATE INDEX ix_queue_order ON queue (model, anonymous, prio_key, created)"
    )
    conn.execute(update(schema.schema_version).values(version=1))


def _queue_order_definition(conn: Connection) -> str:
    if conn.dialect.name == "sqlite":
        sql = "SELECT sql FROM sqlite_master WHERE name = 'ix_queue_order'"
    else:
        sql = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_queue_order' AND schemaname = current_schema()"
    return str(conn.exec_driver_sql(sql).scalar_one())


def test_upgrading_a_version_1_database_puts_ix_queue_order_in_pop_order_and_keeps_the_data(
    empty_database: Database,
) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    user_id = db.run_sync(
        queries.create_user, True, "alice", new_key_hash(), 3.0, False, False, NOW
    )
    db.run_sync(_as_version_1, True)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (1, LATEST)
    assert "prio_key DESC" in db.run_sync(_queue_order_definition, False)
    assert db.run_sync(queries.user_by_id, False, user_id)["username"] == "alice"
