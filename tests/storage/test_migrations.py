"""Schema migrations on an empty database and on an up-to-date one."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Float, Integer, MetaData, bindparam, func, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError

from hordelite.contract.transfers import Transfer
from hordelite.errors import RC, HordeError
from hordelite.storage import migrations as _migrations
from hordelite.storage import queries, schema
from hordelite.storage.accounts import transfer_kudos
from hordelite.storage.admin import users_named
from hordelite.storage.database import Database
from hordelite.storage.migrations import (
    LATEST,
    MIGRATIONS,
    _v13_names_and_moderation_that_hold,
    current_version,
    upgrade,
)
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


@pytest.fixture
def db(empty_database: Database) -> Database:
    """A database upgraded to the latest version, holding nothing yet: a
    test puts it back in an older version's shape to upgrade it again."""
    empty_database.run_sync(upgrade, True)
    return empty_database


def _back_to(version: int, *statements: str) -> Callable[[Tx], None]:
    """What puts a database back in ``version``'s shape: ``statements``
    undo what the later migrations changed, and the version recorded
    is set back."""

    def back(conn: Tx) -> None:
        for statement in statements:
            conn.exec_driver_sql(statement)
        conn.execute(update(schema.schema_version).values(version=version))

    return back


def _user_id(db: Database, name: str, kudos: float = 0.0) -> int:
    """A user created at the latest version; returns its id."""
    return int(
        db.run_sync(queries.create_user, True, name, new_key_hash(), kudos, False, False, NOW)
    )


def test_upgrade_on_an_empty_database_creates_every_table_and_reaches_the_latest_version(
    empty_database: Database,
) -> None:
    assert empty_database.run_sync(current_version, False) == 0

    before, after = empty_database.run_sync(upgrade, True)

    assert (before, after) == (0, LATEST)
    assert empty_database.run_sync(current_version, False) == LATEST
    assert empty_database.run_sync(_tables, False) >= set(schema.metadata.tables)


def test_a_second_upgrade_changes_nothing_and_keeps_the_data(db: Database) -> None:
    user_id = _user_id(db, "alice", 12.5)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (LATEST, LATEST)
    assert db.run_sync(current_version, False) == LATEST
    assert db.run_sync(_version_rows, False) == 1
    user = db.run_sync(queries.user_by_id, False, user_id)
    assert user.username == "alice"
    assert user.kudos == 12.5


# Back to version 1's shape: ix_queue_order all ascending.
_as_version_1 = _back_to(
    1,
    "DROP INDEX ix_queue_order",
    "CREATE INDEX ix_queue_order ON queue (model, anonymous, prio_key, created)",
)


def _queue_order_definition(conn: Tx) -> str:
    if conn.dialect.name == "sqlite":
        sql = "SELECT sql FROM sqlite_master WHERE name = 'ix_queue_order'"
    else:
        sql = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_queue_order' AND schemaname = current_schema()"
    return str(conn.exec_driver_sql(sql).scalar_one())


def test_upgrading_a_version_1_database_puts_ix_queue_order_in_pop_order_and_keeps_the_data(
    db: Database,
) -> None:
    user_id = _user_id(db, "alice", 3.0)
    db.run_sync(_as_version_1, True)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (1, LATEST)
    assert "prio_key DESC" in db.run_sync(_queue_order_definition, False)
    assert db.run_sync(queries.user_by_id, False, user_id).username == "alice"


# Back to version 3's shape: workers without name_key.
_as_version_3 = _back_to(
    3,
    "DROP INDEX ux_workers_name_key",
    "ALTER TABLE workers DROP COLUMN name_key",
)


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
    db: Database,
) -> None:
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


# Back to version 4's shape: workers without online_until.
_as_version_4 = _back_to(
    4,
    "DROP INDEX ix_workers_online_until",
    "ALTER TABLE workers DROP COLUMN online_until",
)


def test_upgrading_a_version_4_database_keeps_its_workers_online_300_s_after_their_last_pop(
    db: Database,
) -> None:
    user_id = _user_id(db, "bob")
    db.run_sync(_add_worker, True, "w1", user_id, NOW)
    db.run_sync(_as_version_4, True)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (4, LATEST)
    online = db.run_sync(queries.online_workers, False, NOW + 299)
    assert [w.id for w in online] != []
    assert db.run_sync(queries.online_workers, False, NOW + 301) == []


# Back to version 5's shape: no activity_minutes.
_as_version_5 = _back_to(5, "DROP TABLE activity_minutes")


def test_upgrading_a_version_5_database_adds_an_empty_activity_rollup_and_keeps_the_data(
    db: Database,
) -> None:
    user_id = _user_id(db, "bob")
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


# Back to version 7's shape: no readers, no reader columns.
_as_version_7 = _back_to(
    7,
    "DROP INDEX ix_requests_reader",
    "DROP TABLE readers",
    "ALTER TABLE requests DROP COLUMN reader",
    "ALTER TABLE requests DROP COLUMN unread",
)


def test_upgrading_a_version_7_database_adds_the_readers_and_their_columns(db: Database) -> None:
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


# The version before user names were keyed (decision 0073), wherever the
# migration stands in the list.
_BEFORE_USER_KEYS = MIGRATIONS.index(_v13_names_and_moderation_that_hold)


# Back to the shape before user name keys: no users.name_key, no worker_holds.
_as_before_user_keys = _back_to(
    _BEFORE_USER_KEYS,
    "DROP INDEX ux_users_name_key",
    "ALTER TABLE users DROP COLUMN name_key",
    "DROP TABLE worker_holds",
)


def _add_user(conn: Tx, name: str, kudos: float) -> int:
    # Without name_key: the column is not there yet.
    row = conn.execute(
        insert(schema.users)
        .values(username=name, key_hash=new_key_hash(), kudos=kudos, created=NOW)
        .returning(schema.users.c.id)
    )
    return int(row.scalar_one())


def _user_keys(conn: Tx) -> dict[int, tuple[str, str, float]]:
    rows = conn.execute(
        select(
            schema.users.c.id,
            schema.users.c.username,
            schema.users.c.name_key,
            schema.users.c.kudos,
        )
    )
    return {r.id: (r.username, r.name_key, r.kudos) for r in rows}


def test_upgrading_keys_user_names_and_keeps_every_user_sharing_one(db: Database) -> None:
    db.run_sync(_as_before_user_keys, True)
    db.run_sync(
        lambda conn: conn.execute(
            insert(schema.users).values(
                id=0, username="Anonymous", key_hash="0", anonymous=True, created=NOW
            )
        ),
        True,
    )
    # Stored while renames were not compared: look-alikes of one name, and
    # of the anonymous user's.
    first = db.run_sync(_add_user, True, "req2", 5.0)
    look_alikes = [
        db.run_sync(_add_user, True, name, float(i))
        for i, name in enumerate(("REQ2", "\uff52\uff45\uff51\uff12", "anonymous"))
    ]
    other = db.run_sync(_add_user, True, "carol", 1.0)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (_BEFORE_USER_KEYS, LATEST)
    keys = db.run_sync(_user_keys, False)
    # Every user kept, with its name and kudos; the oldest holds each key.
    assert keys[0][1] == "anonymous"
    assert keys[first] == ("req2", "req2", 5.0)
    assert keys[other] == ("carol", "carol", 1.0)
    for i, user_id in enumerate(look_alikes):
        assert keys[user_id][1:] == (f"\x1f{user_id}", float(i))
    # A lookup by the shared name lists every user it may mean, never one.
    named = db.run_sync(users_named, False, "Req2")
    assert [u.id for u in named] == [first, *look_alikes[:2]]
    assert [u.id for u in db.run_sync(users_named, False, "carol")] == [other]
    # The key is unique from now on, and deleted workers' holds have a table.
    with pytest.raises(HordeError) as refused:
        db.run_sync(queries.create_user, True, "CAROL", new_key_hash(), 0, False, False, NOW)
    assert refused.value.rc is RC.UsernameAlreadyExists
    with pytest.raises(IntegrityError):
        db.run_sync(
            lambda conn: conn.execute(
                update(schema.users).where(schema.users.c.id == other).values(name_key="req2")
            ),
            True,
        )
    assert "worker_holds" in db.run_sync(_tables, False)


def _float_ledger() -> MetaData:
    """schema.py's tables as version 11 made them: every kudos column a
    float, and no transfer_keys."""
    old = MetaData()
    for table in schema.metadata.sorted_tables:
        if table.name == "transfer_keys":
            continue
        for column in table.to_metadata(old).columns:
            if isinstance(column.type, schema.Kudos):
                column.type = Float()
    return old


# (table, column) -> (the float stored by version 11, what it reads as now).
FLOATS = {
    ("users", "kudos"): (450.70999999999856, 450.71),
    ("users", "kudos_earned"): (0.30000000000000004, 0.3),
    ("users", "kudos_spent"): (12.3456, 12.346),
    ("users", "kudos_gifted"): (0.0001, 0.0),
    ("users", "kudos_received"): (7.999999999, 8.0),
    ("workers", "kudos_rewards"): (1.1 + 2.2, 3.3),
    ("requests", "kudos"): (2.675, 2.675),
    ("jobs", "reward"): (1.1, 1.1),
    ("jobs", "cost"): (1.2999999999999998, 1.3),
    ("shared_keys", "kudos"): (-1.0, -1.0),
    ("shared_keys", "utilized"): (3.3300000000000005, 3.33),
}


def _fill_float_ledger(conn: Tx, old: MetaData, owner: str, other: str) -> None:
    """A version 11 database holding two users, a worker, a request, its
    job and a shared key, each with its kudos as floats."""
    conn.execute(update(schema.schema_version).values(version=11))
    floats: dict[str, dict[str, float]] = {}
    for (table, column), (stored, _) in FLOATS.items():
        floats.setdefault(table, {})[column] = stored
    # In the order the foreign keys need.
    rows: list[tuple[str, dict[str, Any]]] = [
        (
            "users",
            {"id": 1, "username": "alice", "key_hash": owner, "created": NOW, **floats["users"]},
        ),
        ("users", {"id": 2, "username": "bob", "key_hash": other, "created": NOW}),
        (
            "workers",
            {
                "id": "w1",
                "name": "w1",
                "name_key": "w1",
                "user_id": 1,
                "models": ["m1"],
                "max_length": 80,
                "max_context_length": 1024,
                "created": NOW,
                "last_check_in": NOW,
                **floats["workers"],
            },
        ),
        (
            "requests",
            {
                "id": "r1",
                "user_id": 1,
                "state": "done",
                "prompt": "p",
                "params": {},
                "models": ["m1"],
                "worker_ids": [],
                "n": 1,
                "remaining": 0,
                "max_length": 80,
                "max_context_length": 1024,
                "anonymous": False,
                "priority": 0.0,
                "prio_key": 0.0,
                "created": NOW,
                "expires": NOW + 1,
                **floats["requests"],
            },
        ),
        (
            "jobs",
            {
                "id": "j1",
                "request_id": "r1",
                "worker_id": "w1",
                "owner_id": 1,
                "model": "m1",
                "state": "done",
                "started": NOW,
                "lease_expires": NOW + 1,
                **floats["jobs"],
            },
        ),
        (
            "shared_keys",
            {
                "key_hash": "s" * 64,
                "user_id": 1,
                "max_text_tokens": -1,
                "max_image_pixels": -1,
                "max_image_steps": -1,
                "created": NOW,
                **floats["shared_keys"],
            },
        ),
    ]
    for table, row in rows:
        conn.execute(insert(old.tables[table]).values(row))


def _kudos_columns(conn: Tx, raw: bool) -> dict[tuple[str, str], object]:
    """Each kudos column of FLOATS as read now: through schema.py's types,
    or (``raw``) as the database holds it."""
    found: dict[tuple[str, str], object] = {}
    for table, column in FLOATS:
        if raw:
            found[table, column] = conn.exec_driver_sql(f"SELECT {column} FROM {table}").scalar()
        else:
            found[table, column] = conn.execute(
                select(schema.metadata.tables[table].c[column])
            ).scalar()
    return found


def test_upgrading_a_float_ledger_keeps_every_amount_to_the_thousandth_in_integers(
    db: Database,
) -> None:
    old = _float_ledger()
    db.run_sync(lambda conn: schema.metadata.drop_all(conn.connection), True)
    db.run_sync(lambda conn: old.create_all(conn.connection), True)
    db.run_sync(lambda conn: conn.execute(insert(schema.schema_version).values(version=11)), True)
    owner, other = new_key_hash(), new_key_hash()
    db.run_sync(_fill_float_ledger, True, old, owner, other)

    before, after = db.run_sync(upgrade, True)

    assert (before, after) == (11, LATEST)
    assert db.run_sync(_kudos_columns, False, False) == {k: v[1] for k, v in FLOATS.items()}
    # Stored as whole thousandths (SQLite's columns keep their REAL affinity).
    raw = db.run_sync(_kudos_columns, False, True)
    assert raw == {k: round(v[1] * 1000) for k, v in FLOATS.items()}
    if db.is_sqlite:
        assert all(float(v).is_integer() for v in raw.values())  # type: ignore[arg-type]
    else:
        declared = db.run_sync(
            lambda conn: {
                c["name"]: c["type"] for c in inspect(conn.connection).get_columns("users")
            },
            False,
        )
        assert isinstance(declared["kudos"], Integer)
    # The balance shown, 450.71, can be sent whole (it was refused as "more
    # than your 450.71 kudos").
    moved = db.run_sync(transfer_kudos, True, owner, Transfer("bob", 2, 450.71), RULES, NOW, None)
    assert moved == 450.71
    assert db.run_sync(queries.user_by_id, False, 1).kudos == 0
    assert db.run_sync(queries.user_by_id, False, 2).kudos == 450.71
    # The transfers' keys are stored from now on.
    assert "transfer_keys" in db.run_sync(_tables, False)


_released = (
    update(schema.requests).where(schema.requests.c.id == bindparam("rid")).values(held_bytes=0)
)


# The version before generations were counted, wherever the migration stands.
_BEFORE_GENERATIONS = MIGRATIONS.index(_migrations._v16_generations_in_the_budget)


# Back to the shape before _v16_generations_in_the_budget.
_before_generations_counted = _back_to(
    _BEFORE_GENERATIONS,
    "ALTER TABLE requests DROP COLUMN generation_bytes",
    "ALTER TABLE users DROP COLUMN generation_bytes",
)


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

    assert (before, after) == (_BEFORE_GENERATIONS, LATEST)

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
    await database.write(lambda conn: _migrations._v16_generations_in_the_budget(conn.connection))
    assert await database.read(read) == (per_request, per_user)


_BEFORE_RESPONSES = MIGRATIONS.index(_migrations._v18_stored_responses)


@pytest.mark.anyio
async def test_upgrading_adds_the_stored_responses_record_and_no_request_before_has_one(
    database: Database,
) -> None:
    alice = await create_user(database, "alice", kudos=100)
    request_id = await submit(database, alice, text_request())
    await database.write(_back_to(_BEFORE_RESPONSES, "ALTER TABLE requests DROP COLUMN response"))

    before, after = await database.write(upgrade)

    assert (before, after) == (_BEFORE_RESPONSES, LATEST)
    columns = await database.read(
        lambda conn: {c["name"] for c in inspect(conn.connection).get_columns("requests")}
    )
    assert "response" in columns
    # The request stored before is no Response; it is kept as it was.
    assert await database.read(queries.stored_response, request_id) is None
    assert (
        await database.read(
            lambda conn: conn.execute(
                select(schema.requests.c.state).where(schema.requests.c.id == request_id)
            ).scalar_one()
        )
        == "waiting"
    )
