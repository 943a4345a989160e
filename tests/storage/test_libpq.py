"""Prepared plans on libpq (hordelite/storage/_libpq.py): what PostgreSQL's
fast path prepares, keeps and refuses, seen from the server's own view of
the session (``pg_prepared_statements``).

Each test opens a pool of one connection, so that every transaction runs
on the same session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import ProgrammingError

from hordelite.errors import RC, HordeError
from hordelite.storage import queries
from hordelite.storage.accounts import USER_BY_KEY
from hordelite.storage.database import Database
from hordelite.storage.migrations import upgrade
from hordelite.storage.schema import users
from hordelite.storage.transaction import Tx, prepared
from tests.storage.helpers import ANONYMOUS_HASH, NOW

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_NAMED = prepared(select(users.c.username).where(users.c.username == bindparam("name")))
_GIVE = prepared(
    update(users).where(users.c.username == bindparam("name")).values(kudos=users.c.kudos + 1)
)


@contextlib.contextmanager
def _session(url: str, prepare: bool = True) -> Iterator[Database]:
    """A migrated PostgreSQL Database whose pool holds one connection."""
    db = Database(url, pool_size=1, prepare=prepare)
    try:
        db.run_sync(upgrade, True)
        db.run_sync(queries.ensure_anonymous, True, ANONYMOUS_HASH, NOW)
        yield db
    finally:
        db.dispose()


@pytest.fixture
def one_session(postgres_schema_url: str) -> Iterator[Database]:
    with _session(postgres_schema_url) as db:
        yield db


def _ours(conn: Tx) -> list[str]:
    """The SQL of the statements this session prepared on the fast path."""
    rows = conn.exec_driver_sql(
        "SELECT statement FROM pg_prepared_statements WHERE left(name, 3) = 'hl_' ORDER BY name"
    )
    return [row[0] for row in rows]


def _anonymous(conn: Tx) -> Any:
    return conn.execute(USER_BY_KEY, {"key_hash": ANONYMOUS_HASH}).first()


async def test_a_statement_is_prepared_once_per_session_and_run_by_name(
    one_session: Database,
) -> None:
    for _ in range(3):
        found = await one_session.read(_anonymous)
        assert found is not None
        assert found.anonymous

    prepared_sql = await one_session.read(_ours)

    lookups = [sql for sql in prepared_sql if "users.key_hash = $1" in sql]
    assert len(lookups) == 1, prepared_sql


async def test_a_rolled_back_transaction_leaves_the_prepared_statements(
    one_session: Database,
) -> None:
    """A rollback used to cost the session every prepared statement once
    psycopg had prepared one of its own (it then sends DEALLOCATE ALL):
    the next run of a statement prepared before named one the server had
    dropped."""

    def often(conn: Tx) -> None:
        # Past psycopg's default threshold (5 runs) for its own preparing.
        for _ in range(8):
            conn.exec_driver_sql("SELECT count(*) FROM users").all()

    def refused(conn: Tx) -> None:
        conn.execute(_NAMED, {"name": "Anonymous"}).all()
        raise HordeError(RC.BadRequest, "rolled back on purpose")

    assert await one_session.read(_anonymous) is not None
    await one_session.read(often)
    with pytest.raises(HordeError):
        await one_session.write(refused)

    assert await one_session.read(_anonymous) is not None
    assert any("users.key_hash = $1" in sql for sql in await one_session.read(_ours))


async def test_without_prepared_statements_every_statement_goes_with_its_sql(
    postgres_schema_url: str,
) -> None:
    """storage.prepared_statements = false (a pooler in transaction mode):
    the same answers, writes included, and nothing prepared on the server."""
    with _session(postgres_schema_url, prepare=False) as db:
        found = await db.read(_anonymous)
        named = await db.read(lambda conn: conn.execute(_NAMED, {"name": "Anonymous"}).all())

        assert found is not None
        assert found.anonymous
        assert [row.username for row in named] == ["Anonymous"]
        assert await db.read(_ours) == []


async def test_past_the_bound_statements_run_unprepared(one_session: Database) -> None:
    def bounded(conn: Tx) -> list[Any]:
        conn.connection.connection.driver_connection.statements.prepared_max = 1
        conn.execute(USER_BY_KEY, {"key_hash": ANONYMOUS_HASH}).first()
        return conn.execute(_NAMED, {"name": "Anonymous"}).all()

    named = await one_session.read(bounded)

    assert [row.username for row in named] == ["Anonymous"]
    prepared_sql = await one_session.read(_ours)
    assert len(prepared_sql) <= 1
    assert not any("users.username = $1" in sql for sql in prepared_sql)


async def test_a_value_the_driver_cannot_send_fails_before_anything_is_sent(
    one_session: Database,
) -> None:
    """The values are dumped before the pipeline opens: the statement fails
    as SQLAlchemy's error, and the session is left as it was."""
    with pytest.raises(ProgrammingError):
        await one_session.read(lambda conn: conn.execute(_NAMED, {"name": object()}).all())

    assert await one_session.read(_anonymous) is not None


async def test_statements_dropped_by_hand_are_prepared_again(one_session: Database) -> None:
    """A session whose statements were dropped (``DEALLOCATE ALL``) fails
    the statement that named one; the next transaction prepares again."""
    assert await one_session.read(_anonymous) is not None
    await one_session.read(lambda conn: conn.exec_driver_sql("DEALLOCATE ALL"))

    with pytest.raises(ProgrammingError):
        await one_session.read(_anonymous)

    assert await one_session.read(_anonymous) is not None
    assert any("users.key_hash = $1" in sql for sql in await one_session.read(_ours))


async def test_one_statement_dropped_by_hand_is_prepared_again_under_a_new_name(
    one_session: Database,
) -> None:
    """Names are never reused on a session: after one statement was dropped
    and the session's names forgotten, preparing again must not collide
    with the statements the server still holds."""
    assert await one_session.read(_anonymous) is not None
    await one_session.read(lambda conn: conn.execute(_NAMED, {"name": "Anonymous"}).all())
    lookup = await one_session.read(
        lambda conn: conn.exec_driver_sql(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%%key_hash = $1%%'"
        ).scalar_one()
    )
    await one_session.read(lambda conn: conn.exec_driver_sql(f"DEALLOCATE {lookup}"))

    with pytest.raises(ProgrammingError):
        await one_session.read(_anonymous)

    for _ in range(2):
        assert await one_session.read(_anonymous) is not None
        named = await one_session.read(
            lambda conn: conn.execute(_NAMED, {"name": "Anonymous"}).all()
        )
        assert [row.username for row in named] == ["Anonymous"]


async def test_a_statement_run_for_many_values_runs_once_each_and_counts_every_row(
    one_session: Database,
) -> None:
    """One statement, several parameter sets (an ``executemany``): each set
    is a run by name in the same pipeline, and the row count is their sum,
    as psycopg's ``executemany`` answers it."""

    def give_twice(conn: Tx) -> tuple[int, float]:
        given = conn.execute(_GIVE, [{"name": "Anonymous"}, {"name": "Anonymous"}]).rowcount
        return given, conn.execute(USER_BY_KEY, {"key_hash": ANONYMOUS_HASH}).one().kudos

    before = await one_session.read(_anonymous)
    given, kudos = await one_session.write(give_twice)

    assert given == 2
    assert kudos == before.kudos + 2
