"""Reads on PostgreSQL (Database._run, decision 0065): each statement runs in
autocommit, so a read costs no BEGIN and no COMMIT round trip; the server
refuses a write there (its connections default to read-only); a write
transaction still writes, on the same connection, after a read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError

from hordelite.storage.database import Database
from hordelite.storage.schema import users
from hordelite.storage.transaction import Tx
from tests.storage.conftest import _migrate
from tests.storage.helpers import NOW, create_user

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def one_connection(postgres_schema_url: str) -> Iterator[Database]:
    """A migrated PostgreSQL Database of one pooled connection: every
    transaction runs on the same one."""
    db = Database(postgres_schema_url, pool_size=1)
    try:
        yield _migrate(db)
    finally:
        db.dispose()


def _transaction_status(conn: Tx) -> TransactionStatus:
    return conn.connection.connection.driver_connection.info.transaction_status  # type: ignore[union-attr]


def _names(conn: Tx) -> tuple[list[str], TransactionStatus]:
    names = list(conn.execute(select(users.c.username).order_by(users.c.username)).scalars())
    return names, _transaction_status(conn)


async def test_a_read_holds_no_transaction_open_between_its_statements(
    one_connection: Database,
) -> None:
    await create_user(one_connection, "alice")
    names, during_read = await one_connection.read(_names)
    assert "alice" in names
    assert during_read == TransactionStatus.IDLE  # no BEGIN was sent
    _, during_write = await one_connection.write(_names)
    assert during_write == TransactionStatus.INTRANS


def _insert_user(conn: Tx, name: str) -> None:
    conn.execute(insert(users).values(username=name, key_hash=name * 8, created=NOW))


async def test_a_write_inside_a_read_is_refused_by_the_server_and_nothing_is_stored(
    one_connection: Database,
) -> None:
    with pytest.raises(DBAPIError) as refused:
        await one_connection.read(_insert_user, "mallory")
    assert getattr(refused.value.orig, "sqlstate", None) == "25006"  # read_only_sql_transaction
    names, _ = await one_connection.read(_names)
    assert "mallory" not in names
    # The same connection writes again in a write transaction.
    await one_connection.write(_insert_user, "bob")
    names, _ = await one_connection.read(_names)
    assert "bob" in names
