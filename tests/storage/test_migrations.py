"""Schema migrations on an empty database and on an up-to-date one."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import bindparam, func, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError

from hordelite.storage import migrations as _migrations
from hordelite.storage import queries, schema
from hordelite.storage.database import Database
from hordelite.storage.migrations import LATEST, current_version, upgrade
from hordelite.storage.transaction import Tx
from tests.storage.helpers import (
    NOW,
    RULES,
    activity_rows,
    billions,
    create_user,
    job_submit,
    new_key_hash,
    pop,
    pop_request,
    submit,
    text_request,
)


def _tables(conn: Tx) -> set[str]:
    return set(inspect(conn.connection).get_table_names())


def _version_rows(conn: Tx) -> int:
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
    assert user.username == "alice"
    assert user.kudos == 12.5


def _as_version_1(conn: Tx) -> None:
    """Put the database back in version 1's shape: ix_queue_order all ascending."""
    conn.exec_driver_sql("DROP INDEX ix_queue_order")
    conn.exec_driver_sql(
        "CREATE INDEX ix_queue_order ON queue (model, anonymous, prio_key, created)"
    )
    conn.execute(update(schema.schema_version).values(version=1))


def _queue_order_definition(conn: Tx) -> str:
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
    assert db.run_sync(queries.user_by_id, False, user_id).username == "alice"


def _as_version_3(conn: Tx) -> None:
    """Put the database back in version 3's shape: workers without name_key."""
    conn.exec_driver_sql("DROP INDEX ux_workers_name_key")
    conn.exec_driver_sql("ALTER TABLE workers DROP COLUMN name_key")
    conn.execute(update(schema.schema_version).values(version=3))


def _add_worker(conn: Tx, name: str, user_id: int, created: float) -> str:
    worker_id = str(uuid.uuid4())
    conn.execute(
        insert(schema.workers).values(
            id=worker_id,
            name=name,
            user_id=user_id,
            models=["m1"],
            max_length=80,
            max_context_length=1024,
            created=created,
            last_check_in=created,
        )
    )
    return worker_id


def _name_keys(conn: Tx) -> dict[str, str]:
    rows = conn.execute(select(schema.workers.c.name, schema.workers.c.name_key)).all()
    return {name: key for name, key in rows}


def test_upgrading_a_version_3_database_keys_worker_names_and_keeps_every_worker(
    empty_database: Database,
) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    owner = new_key_hash()
    user_id = db.run_sync(queries.create_user, True, "bob", owner, 0.0, False, False, NOW)
    db.run_sync(_as_version_3, True)
    # Stored before names were compared by key: three spellings of one name.
    first = db.run_sync(_add_worker, True, "Alice", user_id, NOW)
    later = db.run_sync(_add_worker, True, "ALICE", user_id, NOW + 1)
    db.run_sync(_add_worker, True, "Ａｌｉｃｅ", user_id, NOW + 2)  # noqa: RUF001
    db.run_sync(_add_worker, True, "Bob\u200d", user_id, NOW)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (3, LATEST)
    keys = db.run_sync(_name_keys, False)
    assert len(keys) == 4  # every worker kept
    assert (keys["Alice"], keys["Bob\u200d"]) == ("alice", "bob")
    # The later look-alikes keep their rows under keys no name reaches.
    assert keys["ALICE"] == f"\x1f{later}"
    assert keys["Ａｌｉｃｅ"].startswith("\x1f")  # noqa: RUF001
    # Any spelling now finds the oldest, and its owner's pops are that worker.
    found = db.run_sync(queries.worker_details, False, None, "alice")
    assert found is not None
    assert found.id == first
    popped = db.run_sync(
        queries.pop_job, True, owner, pop_request("ALICE", ["m1"]), NOW + 3, RULES, False
    )
    assert popped.worker.id == first
    # The key is unique from now on.
    with pytest.raises(IntegrityError):
        db.run_sync(
            lambda conn: conn.execute(
                update(schema.workers).where(schema.workers.c.id == later).values(name_key="alice")
            ),
            True,
        )


def _as_version_4(conn: Tx) -> None:
    """Put the database back in version 4's shape: workers without online_until."""
    conn.exec_driver_sql("DROP INDEX ix_workers_online_until")
    conn.exec_driver_sql("ALTER TABLE workers DROP COLUMN online_until")
    conn.execute(update(schema.schema_version).values(version=4))


def test_upgrading_a_version_4_database_keeps_its_workers_online_300_s_after_their_last_pop(
    empty_database: Database,
) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    user_id = db.run_sync(queries.create_user, True, "bob", new_key_hash(), 0.0, False, False, NOW)
    db.run_sync(_add_worker, True, "w1", user_id, NOW)
    db.run_sync(_as_version_4, True)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (4, LATEST)
    online = db.run_sync(queries.online_workers, False, NOW + 299)
    assert [w.id for w in online] != []
    assert db.run_sync(queries.online_workers, False, NOW + 301) == []


def _as_version_5(conn: Tx) -> None:
    """Put the database back in version 5's shape: no activity_minutes."""
    conn.exec_driver_sql("DROP TABLE activity_minutes")
    conn.execute(update(schema.schema_version).values(version=5))


def test_upgrading_a_version_5_database_adds_an_empty_activity_rollup_and_keeps_the_data(
    empty_database: Database,
) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    user_id = db.run_sync(queries.create_user, True, "bob", new_key_hash(), 0.0, False, False, NOW)
    db.run_sync(_as_version_5, True)
    assert "activity_minutes" not in db.run_sync(_tables, False)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (5, LATEST)
    assert db.run_sync(activity_rows, False) == []
    assert db.run_sync(queries.user_by_id, False, user_id).username == "bob"
    # The table takes rows: the sweep's purge writes there.
    db.run_sync(
        lambda conn: conn.execute(
            insert(schema.activity_minutes).values(minute=60, jobs=1, tokens=2, latency_sum=3.0)
        ),
        True,
    )
    assert db.run_sync(activity_rows, False) == [(60, 1, 2, 3.0)]


def _as_version_7(conn: Tx) -> None:
    """Put the database back in version 7's shape: no readers, no reader columns."""
    conn.exec_driver_sql("DROP INDEX ix_requests_reader")
    conn.exec_driver_sql("DROP TABLE readers")
    conn.exec_driver_sql("ALTER TABLE requests DROP COLUMN reader")
    conn.exec_driver_sql("ALTER TABLE requests DROP COLUMN unread")
    conn.execute(update(schema.schema_version).values(version=7))


def test_upgrading_a_version_7_database_adds_the_readers_and_their_columns(
    empty_database: Database,
) -> None:
    db = empty_database
    db.run_sync(upgrade, True)
    db.run_sync(_as_version_7, True)
    assert "readers" not in db.run_sync(_tables, False)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (7, LATEST)
    columns = db.run_sync(
        lambda conn: {c["name"] for c in inspect(conn.connection).get_columns("requests")}, False
    )
    assert {"reader", "unread"} <= columns
    # A process takes its reader over, and nothing stored before is its.
    assert db.run_sync(queries.take_over, True, "host:7001/0", NOW + 30) == []
    assert db.run_sync(queries.lapsed_requests, True, NOW + 60, "other:1/0") == []


_released = (
    update(schema.requests).where(schema.requests.c.id == bindparam("rid")).values(held_bytes=0)
)


def _before_generations_counted(conn: Tx) -> None:
    """Put the database back in the shape before _generations_in_the_budget."""
    conn.exec_driver_sql("ALTER TABLE requests DROP COLUMN generation_bytes")
    conn.exec_driver_sql("ALTER TABLE users DROP COLUMN generation_bytes")
    conn.execute(update(schema.schema_version).values(version=LATEST - 1))


@pytest.mark.anyio
async def test_upgrading_counts_the_generations_already_stored_in_bytes(
    database: Database,
) -> None:
    alice = await create_user(database, "alice", kudos=100)
    bob = await create_user(database, "bob")
    stored = {}
    for generation in ("é" * 10, "abc"):
        request_id = await submit(database, alice, text_request(params={"max_length": 16}))
        popped = await pop(database, bob, "w1", ["m"], max_length=16)
        assert popped.job is not None
        await database.write(
            queries.submit_job, bob, job_submit(popped.job.id, generation), NOW, RULES, billions
        )
        stored[request_id] = len(generation.encode())
    # The first one released (as the sweep does once it ended), the second still held.
    first = next(iter(stored))
    await database.write(lambda conn: conn.execute(_released, {"rid": first}))
    await database.write(_before_generations_counted)

    before, after = await database.write(upgrade)

    assert (before, after) == (LATEST - 1, LATEST)

    def read(conn: Tx) -> tuple[dict[str, int], dict[str, int]]:
        per_request = dict(
            conn.execute(select(schema.requests.c.id, schema.requests.c.generation_bytes)).all()
        )
        per_user = dict(
            conn.execute(select(schema.users.c.username, schema.users.c.generation_bytes)).all()
        )
        return per_request, per_user

    per_request, per_user = await database.read(read)
    assert per_request == stored  # 20 bytes of "é" * 10, 3 of "abc"
    # The released request's generation counts on its user; the held one's
    # will when it is released.
    assert (per_user["alice"], per_user["bob"]) == (20, 0)
    # Run again, it changes nothing.
    await database.write(lambda conn: _migrations._generations_in_the_budget(conn.connection))
    assert await database.read(read) == (per_request, per_user)
