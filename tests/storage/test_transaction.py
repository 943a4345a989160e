"""The fast path of prepared statements (hordelite/storage/transaction.py):
it answers what SQLAlchemy answers for the same statement, on SQLite and
PostgreSQL; every prepared statement the request cycle runs has a plan
(none falls back); whoever listens to SQLAlchemy's statements still hears
them."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError, MultipleResultsFound, NoResultFound

from hordelite.storage import _libpq, queries, transaction
from hordelite.storage.accounts import USER_BY_KEY
from hordelite.storage.database import Database
from hordelite.storage.schema import requests, users
from hordelite.storage.transaction import Tx, prepared
from tests.storage.helpers import (
    ANONYMOUS_HASH,
    NOW,
    RULES,
    billions,
    create_user,
    heard_statements,
    job_submit,
    pop,
    status,
    submit,
    text_request,
)

pytestmark = pytest.mark.anyio

# Statements of this test's own, marked as the storage modules mark theirs.
_USERS_ABOVE = prepared(
    select(users.c.id, users.c.username, users.c.anonymous, users.c.kudos)
    .where(users.c.kudos >= bindparam("least"))
    .order_by(users.c.id)
)
_KUDOS_SUM = prepared(select(users.c.kudos + 0).where(users.c.id >= bindparam("least")))
_GRANT = prepared(
    update(users).where(users.c.kudos >= bindparam("least")).values(kudos=users.c.kudos + 1)
)
_INSERT_USER = prepared(insert(users))
# Without RETURNING (an insert that reads back its new id returns a row,
# and a statement with rows is not deferred).
_ADD_USER = prepared(insert(users).inline())


def _both(conn: Tx, statement: Any, params: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Rows of the fast path, and of SQLAlchemy itself, for one statement."""
    fast = [tuple(r) for r in conn.execute(statement, params).all()]
    slow = [tuple(r) for r in conn.connection.execute(statement, params).all()]
    return fast, slow


async def test_a_prepared_statement_answers_the_rows_sqlalchemy_answers(database: Database) -> None:
    await create_user(database, "alice", kudos=10)
    await create_user(database, "bob", kudos=0.5)

    def check(conn: Tx) -> None:
        fast, slow = _both(conn, _USERS_ABOVE, {"least": 0})
        assert fast == slow
        assert [type(v) for v in fast[0]] == [type(v) for v in slow[0]]  # bool stays bool
        fast, slow = _both(conn, USER_BY_KEY, {"key_hash": ANONYMOUS_HASH})
        assert fast == slow

    await database.read(check)


async def test_rows_read_by_attribute_index_mapping_and_as_tuples(database: Database) -> None:
    await create_user(database, "alice", kudos=10)

    def check(conn: Tx) -> None:
        row = conn.execute(_USERS_ABOVE, {"least": 5}).one()
        user_id, name, anonymous, kudos = row
        assert (row.username, row[1], row._mapping["username"], name) == ("alice",) * 4
        assert (anonymous, kudos) == (False, 10)
        assert dict(conn.execute(_USERS_ABOVE, {"least": 5}).mappings().one()) == {
            "id": user_id,
            "username": "alice",
            "anonymous": False,
            "kudos": 10,
        }
        assert conn.execute(_USERS_ABOVE, {"least": 5}).scalar_one() == user_id
        assert conn.execute(_USERS_ABOVE, {"least": 5}).scalars().all() == [user_id]
        assert conn.execute(_USERS_ABOVE, {"least": 1e9}).first() is None
        assert conn.execute(_USERS_ABOVE, {"least": 1e9}).mappings().first() is None
        assert conn.execute(_USERS_ABOVE, {"least": 1e9}).scalar() is None
        with pytest.raises(NoResultFound):
            conn.execute(_USERS_ABOVE, {"least": 1e9}).one()
        with pytest.raises(MultipleResultsFound):
            conn.execute(_USERS_ABOVE, {"least": -1}).one()  # alice and the anonymous user

    await database.read(check)


async def test_an_update_counts_its_rows_and_an_insert_fills_in_its_defaults(
    database: Database,
) -> None:
    def write(conn: Tx) -> int:
        # anonymous, admin, trusted have Python-side defaults (False).
        conn.execute(_INSERT_USER, {"username": "carol", "key_hash": "h1", "created": NOW})
        conn.execute(
            _INSERT_USER,
            [
                {"username": "dan", "key_hash": "h2", "created": NOW},
                {"username": "eve", "key_hash": "h3", "created": NOW},
            ],
        )
        return int(conn.execute(_GRANT, {"least": 0}).rowcount)

    assert await database.write(write) == 4  # the anonymous user and the three

    def read(conn: Tx) -> list[tuple[Any, ...]]:
        stmt = select(users.c.username, users.c.admin, users.c.trusted, users.c.kudos)
        return [tuple(r) for r in conn.execute(stmt.order_by(users.c.id)).all()]

    assert (await database.read(read))[1:] == [
        ("carol", False, False, 1.0),
        ("dan", False, False, 1.0),
        ("eve", False, False, 1.0),
    ]


async def test_a_driver_error_on_the_fast_path_is_raised_as_sqlalchemy_raises_it(
    database: Database,
) -> None:
    """Callers catch SQLAlchemy's errors (Database retries an IntegrityError,
    turns an OperationalError into StorageUnavailable): the fast path
    raises those, not the driver's own."""

    def duplicate(conn: Tx) -> None:
        for name in ("alice", "bob"):  # key hashes are unique
            conn.execute(_INSERT_USER, {"username": name, "key_hash": "h9", "created": NOW})

    with pytest.raises(IntegrityError) as raised:
        await database.write(duplicate)
    assert isinstance(raised.value.orig, database.engine.dialect.loaded_dbapi.IntegrityError)


async def test_whoever_listens_to_sqlalchemys_statements_hears_the_prepared_ones(
    database: Database,
) -> None:
    with heard_statements(database) as heard:
        await database.read(lambda conn: conn.execute(_USERS_ABOVE, {"least": 0}).all())
    assert any("FROM users" in s and "ORDER BY users.id" in s for s in heard)


async def test_no_prepared_statement_of_the_request_cycle_falls_back_to_sqlalchemy(
    database: Database,
) -> None:
    """A SQLAlchemy release that changes what a plan reads fails here,
    rather than quietly sending every statement the slow way."""
    requester = await create_user(database, "alice", kudos=100)
    owner = await create_user(database, "bob")
    request_id = await submit(database, requester, text_request(models=["m1"]))
    popped = await pop(database, owner, "w1", ["m1"], now=NOW + 1)
    assert popped.job is not None
    await database.write(
        queries.submit_job, owner, job_submit(popped.job.id, "The end."), NOW + 2, RULES, billions
    )
    await status(database, request_id, now=NOW + 3)
    await database.write(queries.sweep, NOW + 10, RULES, {})
    dialect = database.engine.dialect.name
    ran = {key for key in transaction._PLANS if key[1] == dialect}
    assert ran, "no prepared statement ran"
    fell_back = [
        (str(transaction._PREPARED[key[0]]), sorted(key[2]))
        for key in ran
        if transaction._PLANS[key] is None
    ]
    assert fell_back == []


async def test_a_numeric_aggregate_comes_back_as_sqlalchemy_returns_it(
    database: Database,
) -> None:
    """On PostgreSQL a plan's result processors follow the type the server
    reports (read at its first run), as SQLAlchemy's do."""
    await create_user(database, "alice", kudos=2.5)

    def check(conn: Tx) -> None:
        fast, slow = _both(conn, _KUDOS_SUM, {"least": 0})
        assert fast == slow
        assert [type(v) for r in fast for v in r] == [type(v) for r in slow for v in r]

    await database.read(check)
    fast_requests = select(requests.c.id).limit(1)  # not prepared: SQLAlchemy runs it
    assert await database.read(lambda conn: conn.execute(fast_requests).all()) == []


def _grant_and_add(conn: Tx) -> None:
    """Defer an insert and an update whose WHERE reads the insert."""
    conn.defer(_ADD_USER, {"username": "carol", "key_hash": "h-carol", "created": NOW})
    conn.defer(_GRANT, {"least": 0})


async def test_deferred_writes_run_in_order_and_the_next_statement_sees_them(
    database: Database,
) -> None:
    """A deferred write is not lost or reordered: the statement after it,
    prepared or not, reads what it wrote, and the commit keeps it."""
    await create_user(database, "alice", kudos=2)

    def check(conn: Tx) -> dict[str, float]:
        _grant_and_add(conn)
        fast = {r.username: r.kudos for r in conn.execute(_USERS_ABOVE, {"least": 0}).all()}
        conn.defer(_GRANT, {"least": 0})
        slow = conn.execute(select(users.c.username, users.c.kudos)).all()
        assert {r.username: r.kudos for r in slow} == {name: k + 1 for name, k in fast.items()}
        conn.defer(_GRANT, {"least": 0})  # the last one goes with the commit
        return fast

    fast = await database.write(check)
    assert (fast["alice"], fast["carol"]) == (3.0, 1.0)
    after = await database.read(lambda conn: conn.execute(_USERS_ABOVE, {"least": 0}).all())
    assert {r.username: r.kudos for r in after if r.username != "Anonymous"} == {
        "alice": 5.0,
        "carol": 3.0,
    }


async def test_a_deferred_write_that_fails_fails_its_transaction_whole(
    database: Database,
) -> None:
    """A deferred insert that breaks a unique key raises SQLAlchemy's
    IntegrityError from the write (where Database retries and then gives
    up), and nothing of the transaction stays."""

    def duplicate(conn: Tx) -> None:
        conn.execute(_INSERT_USER, {"username": "alice", "key_hash": "h9", "created": NOW})
        conn.defer(_GRANT, {"least": 0})
        conn.defer(_ADD_USER, {"username": "bob", "key_hash": "h9", "created": NOW})

    with pytest.raises(IntegrityError) as raised:
        await database.write(duplicate)
    assert isinstance(raised.value.orig, database.engine.dialect.loaded_dbapi.IntegrityError)
    left = await database.read(lambda conn: conn.execute(_USERS_ABOVE, {"least": -1}).all())
    assert [r.username for r in left] == ["Anonymous"]


@pytest.mark.postgres
async def test_on_postgresql_deferred_writes_go_with_the_next_statement_or_the_commit(
    postgresql_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of deferring: on PostgreSQL the writes are sent in one
    pipeline with what follows them (one batch on libpq, one round trip),
    the last ones with the COMMIT, which ends the transaction."""
    batches: list[list[str]] = []
    run = _libpq.Statements.run

    def recorded(self: _libpq.Statements, batch: list[_libpq.Statement]) -> Any:
        batches.append([statement.sql.split()[0] for statement in batch])
        return run(self, batch)

    def work(conn: Tx) -> None:
        _grant_and_add(conn)
        conn.execute(_USERS_ABOVE, {"least": 0}).all()
        conn.defer(_GRANT, {"least": 0})
        conn.defer(_GRANT, {"least": 1})

    monkeypatch.setattr(_libpq.Statements, "run", recorded)
    await postgresql_database.write(work)
    assert batches == [
        ["BEGIN", "INSERT", "UPDATE", "SELECT"],
        ["UPDATE", "UPDATE", "COMMIT"],
    ]
    kudos = await postgresql_database.read(
        lambda conn: conn.execute(_USERS_ABOVE, {"least": 0}).all()
    )
    # carol: 0, then +1 (least 0), +1 (least 0), +1 (least 1): all in order.
    assert {r.username: r.kudos for r in kudos}["carol"] == 3.0


async def test_without_pipeline_mode_deferred_writes_go_one_at_a_time(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older libpq has no pipeline mode: what was deferred is then sent
    statement by statement, with the same outcome."""
    monkeypatch.setattr(transaction, "_PIPELINES", False)
    await create_user(database, "alice", kudos=2)

    def work(conn: Tx) -> float:
        _grant_and_add(conn)
        kudos = {r.username: r.kudos for r in conn.execute(_USERS_ABOVE, {"least": 0}).all()}
        conn.defer(_GRANT, {"least": 0})
        return kudos["carol"]

    assert await database.write(work) == 1.0
    after = await database.read(lambda conn: conn.execute(_USERS_ABOVE, {"least": 0}).all())
    assert {r.username: r.kudos for r in after}["carol"] == 2.0
