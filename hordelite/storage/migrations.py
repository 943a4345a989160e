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

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    LargeBinary,
    Table,
    cast,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.sql import sqltypes

from hordelite.contract.limits import MAX_NAME_KEY
from hordelite.contract.unicode_rules import fold_name
from hordelite.storage import schema
from hordelite.storage.transaction import Tx


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


def _add_missing_columns(conn: Connection) -> None:
    """ALTER TABLE ... ADD COLUMN for every column schema.py has and the database lacks."""
    inspector = inspect(conn)
    for table in schema.metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            ddl = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column.type.compile(conn.dialect)}"
            if column.server_default is not None:
                default = column.server_default.arg  # type: ignore[attr-defined]
                value = (
                    default
                    if isinstance(default, str)
                    else str(default.compile(dialect=conn.dialect))
                )
                ddl += f" DEFAULT {value if not isinstance(default, str) else repr(default)}"
            if not column.nullable:
                ddl += " NOT NULL"
            conn.exec_driver_sql(ddl)


def _recreate_index(conn: Connection, name: str) -> None:
    conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
    for table in schema.metadata.tables.values():
        for index in table.indexes:
            if index.name == name:
                index.create(conn)


def _grow(conn: Connection, tables: Sequence[Table] = (), indexes: Sequence[str] = ()) -> None:
    """What a version adds to the schema and nothing else: the columns the
    database lacks, ``tables`` where they are missing, and ``indexes`` made
    anew as schema.py defines them."""
    _add_missing_columns(conn)
    for table in tables:
        table.create(conn, checkfirst=True)
    for name in indexes:
        _recreate_index(conn, name)


def _v3(conn: Connection) -> None:
    # Chat requests: the chat columns, the queue classes, and the queue
    # walked per (model, kind, features) class; the skipped sample read in
    # priority order without a sort.
    _add_missing_columns(conn)
    schema.metadata.create_all(conn, checkfirst=True)
    _recreate_index(conn, "ix_queue_order")
    _recreate_index(conn, "ix_requests_order")


def _v4(conn: Connection) -> None:
    # Worker names compared by a normalised key (NFKC, case-folded) with a
    # unique index. Names stored before may share a key ("Alice" and
    # "ALICE"): the oldest worker keeps it, and each later one gets a key no
    # name can fold to (a control character, which names may not hold,
    # before its id), so every row stays, reachable by its id.
    _add_missing_columns(conn)
    workers = schema.workers
    _key_names(conn, workers, workers.c.name, (workers.c.created, workers.c.id))
    conn.exec_driver_sql(
        "CREATE UNIQUE INDEX IF NOT EXISTS ux_workers_name_key ON workers (name_key)"
    )


def _key_names(
    conn: Connection, table: Table, name: Column[str], oldest_first: tuple[Any, ...]
) -> None:
    """Fill in the name key of each row of ``table`` without one: the fold
    of its ``name``, or, where an older row (``oldest_first``) holds that
    key already or the name folds to none, a retired key no name folds to
    (RETIRED_NAME_KEY and its id), so every row stays, reachable by its id."""
    rows = conn.execute(
        select(table.c.id, name).where(table.c.name_key.is_(None)).order_by(*oldest_first)
    ).all()
    taken = set(
        conn.execute(select(table.c.name_key).where(table.c.name_key.is_not(None))).scalars()
    )
    for row_id, value in rows:
        key = fold_name(value)
        if key in taken or not key or len(key) > MAX_NAME_KEY:
            key = f"{schema.RETIRED_NAME_KEY}{row_id}"
        taken.add(key)
        conn.execute(update(table).where(table.c.id == row_id).values(name_key=key))


def _v5(conn: Connection) -> None:
    # workers.online_until (hordelite.contract.presence): a long-polling
    # worker's check-in lasts about twice its wait, and a worker that stops
    # says so. Workers stored before keep the rule they were checked in
    # under: online for 300 seconds (the default horde.worker_online) after
    # their last pop, until they pop again.
    _add_missing_columns(conn)
    conn.execute(
        update(schema.workers)
        .where(schema.workers.c.online_until == 0)
        .values(online_until=schema.workers.c.last_check_in + _V5_ONLINE_SECONDS)
    )
    conn.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_workers_online_until ON workers (online_until)"
    )


_V5_ONLINE_SECONDS = 300.0


def _v6(conn: Connection) -> None:
    # activity_minutes: the dashboard's per-minute figures of done jobs
    # purged with their requests, so its hour no longer ends at the
    # retention. Starts empty: the jobs purged before were not counted.
    schema.activity_minutes.create(conn, checkfirst=True)


def _v7(conn: Connection) -> None:
    # Per-user budgets: what each request holds stored, and the indexes the
    # budgets and the sweep's release read. A request stored before counts
    # nothing, and its content goes with the retention purge, as before.
    _grow(
        conn,
        indexes=("ix_requests_user_created", "ix_requests_held_user", "ix_requests_held_ended"),
    )


def _v8(conn: Connection) -> None:
    # OpenAI calls as their requests' only readers (decision 0051): the
    # reader columns, the readers' leases, and the index of a reader's
    # waiting requests. A request stored before has no reader, as a native
    # one: it is charged as before.
    _grow(conn, tables=(schema.readers,), indexes=("ix_requests_reader",))


def _v9(conn: Connection) -> None:
    # A worker's info, an admin's pause, and deletion by its owner; the
    # kudos users sent each other. Every worker stored before has no info,
    # is not paused and not deleted; every user has sent and received 0.
    # Messages to workers start empty; so do the daily statistics (the jobs
    # purged before were not counted).
    _grow(conn, tables=(schema.worker_messages, schema.stats_days))


def _v10(conn: Connection) -> None:
    # Webhooks called (decision 0056): when each is owed, and its tries. A
    # request that ended before owes nothing (its webhook was not to be
    # called then); one still waiting is called when it ends.
    _grow(conn, indexes=("ix_requests_hook_due",))


def _v11(conn: Connection) -> None:
    # Shared keys (decision 0058): the keys, and the key a request was
    # queued through. Every request stored before was queued by its user's
    # own key.
    _grow(conn, tables=(schema.shared_keys,))


def _v12_exact_kudos(conn: Connection) -> None:
    # Kudos as whole thousandths in integers (schema.Kudos, decision 0072):
    # each float amount becomes its thousandths, rounded. A column already
    # of integers (a new database, or one added by _add_missing_columns
    # since) holds thousandths already and is left alone. PostgreSQL's
    # columns become BIGINT; SQLite's keep their declared REAL (changing it
    # means rebuilding each table) and hold integral values, exact there
    # below 2**53. The transfers' Idempotency-Keys start empty.
    inspector = inspect(conn)
    postgresql = conn.dialect.name == "postgresql"
    for table in schema.metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        declared = {c["name"]: c["type"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if not isinstance(column.type, schema.Kudos):
                continue
            if not isinstance(declared.get(column.name), sqltypes.Float):
                continue
            if postgresql:
                conn.exec_driver_sql(
                    f"ALTER TABLE {table.name} ALTER COLUMN {column.name} TYPE BIGINT "
                    f"USING round({column.name} * {schema.KUDOS_SCALE})::bigint"
                )
            else:
                conn.exec_driver_sql(
                    f"UPDATE {table.name} SET {column.name} = "
                    f"CAST(round({column.name} * {schema.KUDOS_SCALE}) AS INTEGER)"
                )
    schema.transfer_keys.create(conn, checkfirst=True)


def _v13_names_and_moderation_that_hold(conn: Connection) -> None:
    # User names compared by a key, as worker names are (decision 0073), with
    # a unique index; and the pauses and maintenance that deleted workers
    # leave to their owners' names. Names stored before may share a key
    # ("req2", and "REQ2" taken by a rename): the oldest user
    # (lowest id; the anonymous user is 0) keeps it, and each later one gets
    # a key no name folds to (a control character before its id). Nothing
    # is renamed or dropped: every user keeps its name, key, kudos and
    # workers, is reachable as NAME#ID, and a lookup by the shared name
    # lists them all (admin.users_named) rather than picking one. Deleted
    # workers from before hold nothing: their names were not kept.
    _add_missing_columns(conn)
    schema.worker_holds.create(conn, checkfirst=True)
    users = schema.users
    _key_names(conn, users, users.c.username, (users.c.id,))
    conn.exec_driver_sql("CREATE UNIQUE INDEX IF NOT EXISTS ux_users_name_key ON users (name_key)")


def _v14_shared_key_reservations(conn: Connection) -> None:
    # A shared key's requests hold their price reserved on it (decision
    # 0058, amended): the price each job holds, and the index of a key's
    # requests. A request queued before holds nothing (its price was not
    # stored): it settles on the key as before. A key's id is derived from
    # its lender's key and a nonce, so that the lender can list its keys:
    # a key lent before has no nonce, and is not listed (its lender deletes
    # it by its id, or a rotation of its key takes it along).
    _grow(conn, indexes=("ix_requests_shared_key",))


def _v15_anonymous_by_address(conn: Connection) -> None:
    # The anonymous user's budgets counted per client address, and budget
    # refusals counted toward the rate (decision 0071). A request stored
    # before has no client: it counts toward no address's budgets (the
    # address it came from was never kept), and ends within the retention.
    _grow(
        conn,
        tables=(schema.budget_refusals,),
        indexes=("ix_requests_client_created", "ix_requests_held_client"),
    )


def _v16_generations_in_the_budget(conn: Connection) -> None:
    # Generations counted in their requester's stored bytes (decision 0069):
    # the bytes each request's generations store (the text its jobs kept,
    # in UTF-8), and each user's sum of them over its released requests
    # (one still held counts them when it is released). Computed anew from
    # what is stored, so running it again changes nothing.
    _add_missing_columns(conn)
    jobs, requests, users = schema.jobs, schema.requests, schema.users
    if conn.dialect.name == "postgresql":
        size = func.octet_length(jobs.c.text)
    else:
        size = func.length(cast(jobs.c.text, LargeBinary))
    per_request = (
        select(func.coalesce(func.sum(size), 0))
        .where(jobs.c.request_id == requests.c.id, jobs.c.text.is_not(None))
        .scalar_subquery()
    )
    conn.execute(update(requests).values(generation_bytes=per_request))
    per_user = (
        select(func.coalesce(func.sum(requests.c.generation_bytes), 0))
        .where(requests.c.user_id == users.c.id, requests.c.held_bytes == 0)
        .scalar_subquery()
    )
    conn.execute(update(users).values(generation_bytes=per_user))
    # And the anonymous user's per client address (decision 0071).
    generations = schema.client_generations
    generations.create(conn, checkfirst=True)
    conn.execute(generations.delete())
    per_client = (
        select(requests.c.client, func.sum(requests.c.generation_bytes))
        .where(
            requests.c.client.is_not(None),
            requests.c.client != "",
            requests.c.held_bytes == 0,
            requests.c.generation_bytes > 0,
        )
        .group_by(requests.c.client)
    )
    conn.execute(insert(generations).from_select(["client", "generation_bytes"], per_client))


def _v17_moderation(conn: Connection) -> None:
    # Moderation and countermeasures (decision 0077): the tables they keep
    # (the audit trail, filters, address timeouts and blocks, the horde's
    # modes) and the columns they add, each created when missing.
    schema.metadata.create_all(conn, checkfirst=True)
    _add_missing_columns(conn)


def _v18_stored_responses(conn: Connection) -> None:
    # Stored OpenAI Responses (decision 0078): the record each keeps with
    # its request. A request stored before has none: it is no Response.
    _grow(conn)


MIGRATIONS: list[Callable[[Connection], None]] = [
    _v1,
    _v2,
    _v3,
    _v4,
    _v5,
    _v6,
    _v7,
    _v8,
    _v9,
    _v10,
    _v11,
    _v12_exact_kudos,
    _v13_names_and_moderation_that_hold,
    _v14_shared_key_reservations,
    _v15_anonymous_by_address,
    _v16_generations_in_the_budget,
    _v17_moderation,
    _v18_stored_responses,
]
LATEST = len(MIGRATIONS)


def current_version(conn: Connection | Tx) -> int:
    if isinstance(conn, Tx):
        conn = conn.connection
    if not inspect(conn).has_table("schema_version"):
        return 0
    version = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(version or 0)


def upgrade(tx: Tx) -> tuple[int, int]:
    """Apply every pending migration; returns (version before, version after).
    Migrations run on SQLAlchemy's own connection: DDL and reflection."""
    conn = tx.connection
    if conn.dialect.name == "postgresql":
        # Replicas starting together: one migrates, the others wait for it.
        # Keyed by the schema too: hordes in other schemas of the same
        # database (test runs side by side) never wait on each other. A
        # replica of a release before this key (the lock 7001 alone) does not
        # wait on it: stop those before starting this release's replicas.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7001, hashtext(current_schema()))")
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
