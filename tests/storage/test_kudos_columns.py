"""Kudos columns hold whole thousandths in integers (schema.Kudos, decision
0072): the database adds, compares and sums integers, so a ledger of
amounts that floats cannot hold exactly stays exact."""

from __future__ import annotations

from sqlalchemy import func, select, update

from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.schema import users
from hordelite.storage.transaction import Tx
from tests.storage.helpers import NOW, new_key_hash


def _add(conn: Tx, user_id: int, amount: float) -> None:
    conn.execute(update(users).where(users.c.id == user_id).values(kudos=users.c.kudos + amount))


def _double(conn: Tx, user_id: int) -> None:
    conn.execute(update(users).where(users.c.id == user_id).values(kudos=users.c.kudos * 2))


def _between(conn: Tx, low: float, high: float) -> list[int]:
    return list(conn.execute(select(users.c.id).where(users.c.kudos.between(low, high))).scalars())


def _stored(conn: Tx, user_id: int) -> object:
    return conn.exec_driver_sql(f"SELECT kudos FROM users WHERE id = {user_id}").scalar()


def _at_least(conn: Tx, amount: float) -> list[int]:
    return list(conn.execute(select(users.c.id).where(users.c.kudos >= amount)).scalars())


def _total(conn: Tx, ids: list[int]) -> float:
    return float(conn.execute(select(func.sum(users.c.kudos)).where(users.c.id.in_(ids))).scalar())


def test_tenths_added_in_sql_sum_and_compare_exactly(database: Database) -> None:
    db = database
    alice = db.run_sync(queries.create_user, True, "alice", new_key_hash(), 0.0, False, False, NOW)
    bob = db.run_sync(queries.create_user, True, "bob", new_key_hash(), 0.2, False, False, NOW)
    # As floats, ten additions of 0.1 make 0.9999999999999999.
    for _ in range(10):
        db.run_sync(_add, True, alice, 0.1)

    assert db.run_sync(queries.user_by_id, False, alice).kudos == 1.0
    assert db.run_sync(_stored, False, alice) == 1000  # thousandths, an integer
    assert db.run_sync(_at_least, False, 1.0) == [alice]
    assert db.run_sync(_total, False, [alice, bob]) == 1.2
    # What is finer than a thousandth is rounded away as it is bound.
    db.run_sync(_add, True, alice, 0.0004)
    assert db.run_sync(_stored, False, alice) == 1000
    db.run_sync(_add, True, alice, -0.0006)
    assert db.run_sync(queries.user_by_id, False, alice).kudos == 0.999
    # A factor is a number, not kudos: doubling doubles.
    db.run_sync(_double, True, alice)
    assert db.run_sync(queries.user_by_id, False, alice).kudos == 1.998
    assert db.run_sync(_between, False, 1.998, 1.998) == [alice]
