"""The workers cap applied by the pop that registers a worker: counted in the
registering transaction, nothing stored when refused, never applied to a
worker already registered, and holding against two first pops at once on
PostgreSQL (the second waits for the first's lock, then counts its worker)."""

from __future__ import annotations

import dataclasses

import anyio
import pytest
from sqlalchemy import select

from hordelite.errors import RC, HordeError
from hordelite.storage import queries
from hordelite.storage.database import BEGIN_WRITE, Database
from hordelite.storage.schema import workers
from hordelite.storage.transaction import Tx
from tests.storage.helpers import NOW, RULES, new_key_hash, pop_request

pytestmark = pytest.mark.anyio

CAPPED = dataclasses.replace(RULES, workers_per_user=2, trusted_workers_per_user=3)


async def owner(db: Database, name: str, *, admin: bool = False, trusted: bool = False) -> str:
    key_hash = new_key_hash()
    await db.write(queries.create_user, name, key_hash, 0.0, admin, trusted, NOW)
    return key_hash


async def pop(
    db: Database, key_hash: str, name: str, rules: queries.Rules = CAPPED
) -> queries.PopResult:
    return await db.write(
        queries.pop_job, key_hash, pop_request(name, ["m"]), NOW, rules, not db.is_sqlite
    )


async def refused(db: Database, key_hash: str, name: str, rules: queries.Rules = CAPPED) -> str:
    """The message of the pop's TooManyWorkers refusal."""
    with pytest.raises(HordeError) as info:
        await pop(db, key_hash, name, rules)
    assert info.value.rc is RC.TooManyWorkers
    return info.value.message


async def registered(db: Database) -> list[str]:
    return list(await db.read(lambda c: c.execute(select(workers.c.name)).scalars().all()))


async def test_the_pop_that_would_register_one_worker_too_many_stores_nothing(
    database: Database,
) -> None:
    alice = await owner(database, "alice")
    await pop(database, alice, "w1")
    await pop(database, alice, "w2")
    message = await refused(database, alice, "w3")
    assert "has 2 workers registered and may have at most 2 (budgets.workers_per_user)" in message
    assert "'w3'" in message
    assert sorted(await registered(database)) == ["w1", "w2"]
    # Another user's cap is its own.
    bob = await owner(database, "bob")
    await pop(database, bob, "b1")


async def test_a_registered_worker_pops_again_past_the_cap_even_one_lowered_since(
    database: Database,
) -> None:
    alice = await owner(database, "alice")
    await pop(database, alice, "w1")
    await pop(database, alice, "w2")
    lowered = dataclasses.replace(CAPPED, workers_per_user=1)
    assert (await pop(database, alice, "w1", lowered)).worker is not None
    assert (await pop(database, alice, "W2", lowered)).worker is not None  # its name key
    assert "may have at most 1" in await refused(database, alice, "w3", lowered)


async def test_a_trusted_user_has_its_cap_and_an_admin_none(database: Database) -> None:
    trusted = await owner(database, "trusted", trusted=True)
    for name in ("t1", "t2", "t3"):
        await pop(database, trusted, name)
    assert "(budgets.trusted_workers_per_user)" in await refused(database, trusted, "t4")
    admin = await owner(database, "admin", admin=True, trusted=True)
    for i in range(5):
        await pop(database, admin, f"a{i}")


async def test_zero_is_no_cap(database: Database) -> None:
    alice = await owner(database, "alice")
    for i in range(5):
        await pop(database, alice, f"w{i}", RULES)  # workers_per_user = 0
    assert len(await registered(database)) == 5


async def test_eight_first_pops_at_once_register_exactly_the_cap(database: Database) -> None:
    alice = await owner(database, "alice")
    outcomes: list[str] = []

    async def one(name: str) -> None:
        try:
            await pop(database, alice, name)
            outcomes.append("registered")
        except HordeError as refusal:
            outcomes.append(refusal.rc.name)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, f"w{i}")
    assert sorted(outcomes) == ["TooManyWorkers"] * 6 + ["registered"] * 2
    assert len(await registered(database)) == 2


async def test_a_first_pop_waits_for_another_uncommitted_one_then_counts_its_worker(
    postgresql_database: Database,
) -> None:
    """The race made certain: the first pop is held uncommitted, so the
    second's unlocked count does not see its worker; only the count under
    the owner's lock, after the first commits, does."""
    db = postgresql_database
    alice = await owner(db, "alice")
    await pop(db, alice, "w1")
    rules = dataclasses.replace(CAPPED, workers_per_user=2)
    second: list[object] = []

    async def second_pop() -> None:
        try:
            second.append(await pop(db, alice, "w3", rules))
        except HordeError as refusal:
            second.append(refusal)

    with db.engine.connect() as first:
        # A write transaction as Database runs one, held open here.
        transaction = first.begin()
        tx = Tx(first, begin=BEGIN_WRITE)
        queries.pop_job(tx, alice, pop_request("w2", ["m"]), NOW, rules, True)
        first_pid = tx.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        async with anyio.create_task_group() as tg:
            tg.start_soon(second_pop)
            # Until the second pop waits on the first's lock; had it not
            # waited (no lock), it has ended, registering one worker too many.
            with anyio.fail_after(10):
                while True:
                    if second or await _blocked_by(db, first_pid):
                        break
                    await anyio.sleep(0.01)
            assert not second, f"the second first pop did not wait: {second}"
            tx.commit_deferred()
            transaction.commit()
    [outcome] = second
    assert isinstance(outcome, HordeError), outcome
    assert outcome.rc is RC.TooManyWorkers
    assert "has 2 workers registered and may have at most 2" in outcome.message
    assert sorted(await registered(db)) == ["w1", "w2"]


async def _blocked_by(db: Database, pid: int) -> bool:
    """Whether a backend waits on a lock ``pid`` holds."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE %(pid)s = ANY(pg_blocking_pids(pid))"

    def count(conn: Tx) -> int:
        return int(conn.exec_driver_sql(query, {"pid": pid}).scalar_one())

    return await db.read(count) > 0
