"""What a one-row read and a small write transaction cost through each database driver.

hordelite runs every transaction through ``Database`` (hordelite/storage/
database.py): SQLAlchemy Core on a sync engine, SQLite inline on the event
loop's thread, PostgreSQL through psycopg on the loop (decision 0059; its
old path, a worker thread per transaction, is measured beside it). This
measures that path against SQLAlchemy's asyncio engine over the asyncio-only drivers
(``postgresql+asyncpg://`` and ``sqlite+aiosqlite://``), and against those
drivers alone without SQLAlchemy (the floor an async driver could reach if
the statements left Core), with the same two transactions:

- read: ``SELECT id, n, name FROM items WHERE id = ?`` in a read transaction;
- write: ``UPDATE items SET n = n + 1 WHERE id = ?`` in a write transaction.

Each path runs them with one caller (p50 latency of a transaction, and
transactions per second) and with ``--callers`` (16) concurrent callers
(transactions per second), each for ``--seconds`` after a short warm-up; the
callers spread over the table's 1,000 rows. The ratio column divides each
figure by ``Database``'s on asyncio measured in the same run (the loop the
asyncio drivers need); ``Database`` on trio, hordelite's default loop, is
printed beside it. Every pool holds 4 connections (hordelite's default
``storage.pool_size``), none reset on return. SQLite: a fresh file in a
temporary folder, WAL and synchronous=NORMAL on every path, and writes one
at a time as ``Database`` runs them (``BEGIN IMMEDIATE`` under a limiter of
one). PostgreSQL (``HORDELITE_TEST_POSTGRES_URL``, by default
postgresql://postgres@127.0.0.1:5432/test): the table lives in a fresh
schema, dropped at the end, and every path's sessions run with
``synchronous_commit = off``: a commit's WAL flush is the server's disk work,
the same whichever driver asks for it, and on a shared disk it swings from
0.4 to 4 ms, which drowns the drivers' difference.

asyncpg, aiosqlite and greenlet (which SQLAlchemy's asyncio engine needs)
are not hordelite dependencies (decision 0041): install them beside it to
run those rows, which are otherwise skipped with the reason.

    .venv/bin/python bench/drivers.py      # the default run, about 35 s
    .venv/bin/python bench/drivers.py --databases sqlite --seconds 0.5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import os
import statistics
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
from _common import DEFAULT_POSTGRES, POSTGRES_ENV  # bench/ is on sys.path
from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    event,
    select,
    text,
)

from hordelite.storage.database import Database

ROWS = 1000
POOL_SIZE = 4  # hordelite's default storage.pool_size
# Commits without waiting for the WAL flush (why: the module docstring).
PG_SETTINGS = {"synchronous_commit": "off"}

Op = Callable[[int], Awaitable[Any]]


@dataclasses.dataclass
class Statements:
    """The two statements, as Core and as each raw driver's SQL."""

    table: Table
    qualified: str  # the table's name in raw SQL

    @property
    def read_core(self) -> Any:
        t = self.table
        return select(t.c.id, t.c.n, t.c.name).where(t.c.id == bindparam("item_id", type_=Integer))

    @property
    def write_core(self) -> Any:
        t = self.table
        return t.update().where(t.c.id == bindparam("item_id", type_=Integer)).values(n=t.c.n + 1)


def items_table(schema: str | None) -> Table:
    return Table(
        "items",
        MetaData(schema=schema),
        Column("id", Integer, primary_key=True),
        Column("n", Integer, nullable=False),
        Column("name", Text, nullable=False),
    )


def read_row(conn: Connection, stmt: Any, item_id: int) -> Any:
    row = conn.execute(stmt, {"item_id": item_id}).first()
    assert row is not None
    return row


def write_row(conn: Connection, stmt: Any, item_id: int) -> None:
    conn.execute(stmt, {"item_id": item_id})


def fill(conn: Any, table: Table) -> None:
    # DDL needs SQLAlchemy's own connection: a Tx holds it (a tree without
    # Tx passes that connection itself).
    bind = conn if isinstance(conn, Connection) else conn.connection
    table.metadata.create_all(bind)
    conn.execute(
        table.insert(), [{"id": i, "n": 0, "name": f"item-{i}"} for i in range(1, ROWS + 1)]
    )


# --- measuring -------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    p50_us: float  # one caller, per transaction
    single_tps: float
    concurrent_tps: float


async def measure(op: Op, seconds: float, callers: int) -> Cell:
    await run_for(op, min(0.2, seconds / 4), callers)  # pools, statement caches
    latencies: list[float] = []
    done, elapsed = await run_for(op, seconds, 1, latencies)
    single = done / elapsed
    done, elapsed = await run_for(op, seconds, callers)
    return Cell(statistics.median(latencies) * 1e6, single, done / elapsed)


async def run_for(
    op: Op, seconds: float, callers: int, latencies: list[float] | None = None
) -> tuple[int, float]:
    """Transactions that ``callers`` concurrent callers finish in ``seconds``."""
    started = time.perf_counter()
    deadline = started + seconds
    done = 0

    async def caller(k: int) -> None:
        nonlocal done
        i = k
        while (now := time.perf_counter()) < deadline:
            await op(i % ROWS + 1)
            if latencies is not None:
                latencies.append(time.perf_counter() - now)
            i += callers
            done += 1

    async with anyio.create_task_group() as tg:
        for k in range(callers):
            tg.start_soon(caller, k)
    return done, time.perf_counter() - started


# --- the paths ---------------------------------------------------------------
# Each yields (read, write): coroutine functions taking a row id.

Opener = Callable[[str, Statements], contextlib.AbstractAsyncContextManager[tuple[Op, Op]]]


@contextlib.asynccontextmanager
async def hordelite_database(
    url: str, st: Statements, executor: str = "inline"
) -> AsyncIterator[tuple[Op, Op]]:
    if url.startswith("postgresql"):
        options = " ".join(f"-c {k}={v}" for k, v in PG_SETTINGS.items())
        url += "?" + urllib.parse.urlencode({"options": options})  # libpq's
    db = Database(url, POOL_SIZE, executor)
    read_stmt, write_stmt = st.read_core, st.write_core

    async def read(item_id: int) -> Any:
        return await db.read(read_row, read_stmt, item_id)

    async def write(item_id: int) -> None:
        await db.write(write_row, write_stmt, item_id)

    try:
        yield read, write
    finally:
        db.dispose()


@contextlib.asynccontextmanager
async def sqlalchemy_asyncio(url: str, st: Statements) -> AsyncIterator[tuple[Op, Op]]:
    from sqlalchemy.ext.asyncio import create_async_engine

    sqlite = url.startswith("sqlite")
    async_url = (
        "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
        if sqlite
        else "postgresql+asyncpg://" + url[len("postgresql://") :]
    )
    engine = create_async_engine(
        async_url,
        pool_size=POOL_SIZE,
        max_overflow=0,
        pool_reset_on_return=None,
        connect_args={} if sqlite else {"server_settings": PG_SETTINGS},
    )
    if sqlite:
        _sqlite_as_hordelite(engine.sync_engine)
    # SQLite writes one at a time, as Database runs them; PostgreSQL's are
    # bounded by the pool alone, as in Database.
    writes = anyio.CapacityLimiter(1 if sqlite else POOL_SIZE)
    read_stmt, write_stmt = st.read_core, st.write_core

    async def read(item_id: int) -> Any:
        async with engine.connect() as conn:
            conn = await conn.execution_options(hordelite_write=False)
            async with conn.begin():
                row = (await conn.execute(read_stmt, {"item_id": item_id})).first()
        assert row is not None
        return row

    async def write(item_id: int) -> None:
        async with writes, engine.begin() as conn:
            await conn.execute(write_stmt, {"item_id": item_id})

    try:
        yield read, write
    finally:
        await engine.dispose()


def _sqlite_as_hordelite(engine: Any) -> None:
    """The journal and BEGIN that Database sets (hordelite/storage/database.py)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("hordelite_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


@contextlib.asynccontextmanager
async def asyncpg_alone(url: str, st: Statements) -> AsyncIterator[tuple[Op, Op]]:
    import asyncpg

    pool = await asyncpg.create_pool(
        url, min_size=POOL_SIZE, max_size=POOL_SIZE, server_settings=PG_SETTINGS
    )
    read_sql = f"SELECT id, n, name FROM {st.qualified} WHERE id = $1"
    write_sql = f"UPDATE {st.qualified} SET n = n + 1 WHERE id = $1"

    async def read(item_id: int) -> Any:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(read_sql, item_id)
        assert row is not None
        return row

    async def write(item_id: int) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(write_sql, item_id)

    try:
        yield read, write
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def aiosqlite_alone(url: str, st: Statements) -> AsyncIterator[tuple[Op, Op]]:
    import aiosqlite

    path = url[len("sqlite:///") :]
    conns = []
    for _ in range(POOL_SIZE):
        conn = await aiosqlite.connect(path, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
            await conn.execute(f"PRAGMA {pragma}")
        conns.append(conn)
    free = list(conns)
    slots = anyio.Semaphore(POOL_SIZE)
    writes = anyio.Lock()
    read_sql = f"SELECT id, n, name FROM {st.qualified} WHERE id = ?"
    write_sql = f"UPDATE {st.qualified} SET n = n + 1 WHERE id = ?"

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[Any]:
        async with slots:
            conn = free.pop()
            try:
                yield conn
            finally:
                free.append(conn)

    async def read(item_id: int) -> Any:
        async with connection() as conn:
            await conn.execute("BEGIN")
            async with conn.execute(read_sql, (item_id,)) as cur:
                row = await cur.fetchone()
            await conn.execute("COMMIT")
        assert row is not None
        return row

    async def write(item_id: int) -> None:
        async with writes, connection() as conn:
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute(write_sql, (item_id,))
            await conn.execute("COMMIT")

    try:
        yield read, write
    finally:
        for conn in conns:
            await conn.close()


@dataclasses.dataclass
class Candidate:
    name: str
    path: Opener
    backend: str  # "trio" or "asyncio"
    needs: tuple[str, ...]  # importable modules the path needs


BASELINE = "Database, asyncio"


def candidates(driver: str, alone: Opener, sqlite: bool) -> list[Candidate]:
    executor = "inline" if sqlite else "psycopg on the loop"
    sa_needs = (driver, "greenlet")
    threads: Opener = functools.partial(hordelite_database, executor="threads")
    return [
        Candidate(f"Database ({executor}), trio", hordelite_database, "trio", ()),
        Candidate(BASELINE, hordelite_database, "asyncio", ()),
        *(
            []
            if sqlite
            else [
                Candidate("Database (psycopg, threads), trio", threads, "trio", ()),
                Candidate("Database (psycopg, threads), asyncio", threads, "asyncio", ()),
            ]
        ),
        Candidate(f"SQLAlchemy asyncio + {driver}", sqlalchemy_asyncio, "asyncio", sa_needs),
        Candidate(f"{driver} alone, no SQLAlchemy", alone, "asyncio", (driver,)),
    ]


async def run_candidate(
    candidate: Candidate, url: str, st: Statements, args: argparse.Namespace
) -> dict[str, Cell]:
    async with candidate.path(url, st) as (read, write):
        return {
            "read": await measure(read, args.seconds, args.callers),
            "write": await measure(write, args.seconds, args.callers),
        }


def missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


# --- the databases ---------------------------------------------------------


@contextlib.contextmanager
def sqlite_database() -> Iterator[tuple[str, Statements]]:
    with tempfile.TemporaryDirectory(prefix="hordelite-bench-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'drivers.db'}"
        table = items_table(None)
        db = Database(url)
        db.run_sync(fill, True, table)
        db.dispose()
        yield url, Statements(table, "items")


@contextlib.contextmanager
def postgres_database(url: str) -> Iterator[tuple[str, Statements]]:
    schema = f"bench_drivers_{uuid.uuid4().hex[:12]}"
    table = items_table(schema)
    db = Database(url)
    db.run_sync(lambda conn: conn.execute(text(f'CREATE SCHEMA "{schema}"')), True)
    try:
        db.run_sync(fill, True, table)
        yield url, Statements(table, f'"{schema}".items')
    finally:
        db.run_sync(lambda conn: conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE')), True)
        db.dispose()


def postgres_reachable(url: str) -> str | None:
    """None when the server answers, else why not."""
    db = Database(url)
    try:
        db.run_sync(lambda conn: conn.execute(text("SELECT 1")), False)
    except Exception as exc:
        return str(exc).splitlines()[0]
    finally:
        db.dispose()
    return None


# --- report ----------------------------------------------------------------


def report(title: str, figures: dict[str, dict[str, Cell] | str], callers: int) -> None:
    print(f"\n{title}")
    header = (
        f"{'path':40} {'op':5} {'1 caller p50 us':>15} {'/ base':>7} "
        f"{'1 caller tx/s':>13} {'/ base':>7} {f'{callers} callers tx/s':>16} {'/ base':>7}"
    )
    print(header)
    base = figures.get(BASELINE)
    for name, cells in figures.items():
        if isinstance(cells, str):
            print(f"{name:40} skipped: {cells}")
            continue
        for op, cell in cells.items():
            ratios = ["", "", ""]
            if isinstance(base, dict):
                b = base[op]
                ratios = [
                    f"{cell.p50_us / b.p50_us:.2f}",
                    f"{cell.single_tps / b.single_tps:.2f}",
                    f"{cell.concurrent_tps / b.concurrent_tps:.2f}",
                ]
            print(
                f"{name:40} {op:5} {cell.p50_us:15.0f} {ratios[0]:>7} "
                f"{cell.single_tps:13.0f} {ratios[1]:>7} {cell.concurrent_tps:16.0f} {ratios[2]:>7}"
            )


def bench(
    title: str,
    database: contextlib.AbstractContextManager[tuple[str, Statements]],
    driver: str,
    alone: Opener,
    sqlite: bool,
    args: argparse.Namespace,
) -> None:
    figures: dict[str, dict[str, Cell] | str] = {}
    with database as (url, st):
        for candidate in candidates(driver, alone, sqlite):
            absent = missing(candidate.needs)
            if absent:
                figures[candidate.name] = f"needs {', '.join(absent)} (not installed)"
                continue
            figures[candidate.name] = anyio.run(
                run_candidate, candidate, url, st, args, backend=candidate.backend
            )
    report(title, figures, args.callers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per figure (default 1)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (16)")
    parser.add_argument(
        "--databases", default="sqlite,postgresql", help="sqlite, postgresql or both"
    )
    args = parser.parse_args()
    chosen = set(args.databases.split(","))
    if "sqlite" in chosen:
        bench("SQLite", sqlite_database(), "aiosqlite", aiosqlite_alone, True, args)
    if "postgresql" in chosen:
        url = os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES)
        why = postgres_reachable(url)
        if why is not None:
            print(f"\nPostgreSQL ({url}): skipped, {why}")
        else:
            pg = postgres_database(url)
            bench(f"PostgreSQL ({url})", pg, "asyncpg", asyncpg_alone, False, args)
    print(
        f"\n{args.seconds:g} s per figure after a warm-up; pools of {POOL_SIZE}; "
        f"ratios to {BASELINE!r} of the same run (p50: lower is better; tx/s: higher)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
