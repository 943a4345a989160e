"""Engines and the thread executor that runs query functions.

Queries are synchronous functions over a SQLAlchemy ``Connection``, written
once for both databases. ``Database.write`` and ``Database.read`` run one in a
worker thread inside one transaction (anyio's ``to_thread``: the same code on
trio and asyncio). The thread is not abandoned on cancellation, so a
transaction that started always finishes, committed or rolled back, before
the caller sees the cancellation.

SQLite: WAL, synchronous=NORMAL, writes serialised in the process by a
capacity limiter of one and ``BEGIN IMMEDIATE`` across processes; reads in
parallel. PostgreSQL: a pool, pops use ``FOR UPDATE SKIP LOCKED``, a deadlock
or serialisation failure is retried; by default each transaction runs on the
event loop's thread, its waits for the server awaited (``_on_loop``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.pool import QueuePool

from hordelite.errors import HordeliteError, StorageUnavailable
from hordelite.storage import _on_loop
from hordelite.storage.transaction import Tx

P = ParamSpec("P")
T = TypeVar("T")

_RETRIES = 5
# Inline transactions waiting at once past which they take turns (see
# Database._inline): above what a busy horde's steady load reaches (the text
# cycle benchmark, 20 clients, stays under it), far below a burst's.
INLINE_TURNS_BACKLOG = 32


def database_url(database: str) -> str:
    """The SQLAlchemy URL for a configured ``storage.database`` value."""
    if database.startswith("postgresql://"):
        return "postgresql+psycopg://" + database[len("postgresql://") :]
    if "://" in database:
        return database
    return f"sqlite:///{Path(database).expanduser()}"


def sqlite_path_problem(url: str) -> str | None:
    """Why the SQLite file of ``url`` (a SQLAlchemy URL) can be neither
    opened nor created, or None (also for a server, or in memory).

    SQLite creates a missing file but not its folder; the blob directory
    beside the file would (``mkdir -p``), and a horde would then quietly
    start empty in a folder made from a typo. So the folder must exist:
    the file is the only thing a start creates."""
    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or name in (None, "", ":memory:"):
        return None
    if name.startswith("file:"):  # a URI filename: SQLite's own to resolve
        return None
    path = Path(name).expanduser().absolute()
    if path.is_dir():
        return f"{path} is a folder, not a SQLite database file"
    if path.parent.is_dir():
        return None
    # The nearest existing folder up the path says which mistake it is.
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{path} is under {above}, which is a file, not a folder"
    return (
        f"{path}: no folder {path.parent} (the database file is created, never its "
        "folder); create the folder, or name another database"
    )


class Database:
    """Runs query functions in transactions.

    ``executor="inline"`` (the SQLite default) runs them on the event loop's
    own thread: a SQLite transaction here takes a fraction of a millisecond,
    while handing it to a thread costs more than the query, because sqlite3
    releases the GIL around every statement and the loop and the thread then
    pass the GIL back and forth (measured: about 1.2 ms of extra server CPU
    per request, docs/decisions). An inline transaction that finds the file
    locked by another process does not wait on the loop: it is retried in a
    thread, which waits.

    On PostgreSQL ``executor="inline"`` (the default) runs each transaction
    on the loop's thread too, in a greenlet whose waits for the server the
    calling task awaits (``_on_loop``): other requests are served while a
    statement is on its way, and no thread hands the GIL back and forth at
    every statement. At most ``pool_size`` transactions are under way at
    once, so a connection is always free when one starts.

    ``executor="threads"`` runs every transaction in a thread, on either
    database.
    """

    def __init__(
        self, database: str, pool_size: int = 4, executor: str = "inline", prepare: bool = True
    ) -> None:
        self.url = database_url(database)
        self.is_sqlite = self.url.startswith("sqlite")
        problem = sqlite_path_problem(self.url) if self.is_sqlite else None
        if problem is not None:  # before anything is opened, or made beside it
            raise StorageUnavailable(problem)
        self.inline = self.is_sqlite and executor == "inline"
        self.on_loop = not self.is_sqlite and executor == "inline"
        if self.is_sqlite:
            self.engine = _sqlite_engine(self.url, pool_size)
            self._inline_engine = _sqlite_engine(self.url, 0, busy_timeout_ms=0)
        else:
            self.engine = _postgresql_engine(self.url, pool_size, prepare)
        # On the loop: one slot per pooled connection, for reads and writes
        # together, so that a checkout never waits (it would block the loop).
        self._slots = anyio.CapacityLimiter(pool_size)
        self._connected_once = False
        self._writes = anyio.CapacityLimiter(1 if self.is_sqlite else pool_size)
        self._reads = anyio.CapacityLimiter(pool_size)
        self._turns = anyio.Lock()
        self._inline_pending = 0

    async def write(
        self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(conn, ...)`` in one write transaction; returns its result."""
        return await self._execute(fn, True, self._writes, args, kwargs)

    async def read(
        self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(conn, ...)`` in one read transaction; returns its result."""
        return await self._execute(fn, False, self._reads, args, kwargs)

    async def read_aside(
        self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``read``, always in a worker thread, for a read whose work grows
        with what the database holds (an aggregate over the pool or the
        queue): inline, SQLite would run it on the event loop's thread and
        hold every other request until it ends; in a thread, sqlite3 lets go
        of the GIL while the statement runs. (On PostgreSQL the server does
        that work, so the read runs as any other.)"""
        if self.on_loop:
            return await self._execute(fn, False, self._reads, args, kwargs)
        return await anyio.to_thread.run_sync(
            lambda: self._run(self.engine, fn, False, args, kwargs), limiter=self._reads
        )

    async def ping(self) -> None:
        """One round trip to the database (raises StorageUnavailable)."""
        await self.read(_ping)

    async def _execute(
        self,
        fn: Callable[..., T],
        write: bool,
        limiter: anyio.CapacityLimiter,
        args: Any,
        kwargs: Any,
    ) -> T:
        """Inline when allowed and the file is free, else in a thread."""
        if self.on_loop:
            async with self._slots:
                if not self._connected_once:
                    await self._connect_once()
                # Started, a transaction ends (committed or rolled back)
                # before the caller sees a cancellation, as in a thread.
                with anyio.CancelScope(shield=True):
                    return await _on_loop.run_on_loop(
                        self._run, self.engine, fn, write, args, kwargs
                    )
        if self.inline:
            try:
                return await self._inline(fn, write, args, kwargs)
            except _Busy:
                pass
        return await anyio.to_thread.run_sync(
            lambda: self._run(self.engine, fn, write, args, kwargs), limiter=limiter
        )

    async def _connect_once(self) -> None:
        """The engine's first connection, made in a thread: SQLAlchemy
        inspects the server on it under a thread lock, which a second
        greenlet on this same thread would wait for forever."""
        await anyio.to_thread.run_sync(self._touch)
        self._connected_once = True

    def _touch(self) -> None:
        try:
            with self.engine.connect():
                pass
        except (OperationalError, InterfaceError) as exc:
            raise StorageUnavailable(str(exc.orig)) from exc

    async def _inline(self, fn: Callable[..., T], write: bool, args: Any, kwargs: Any) -> T:
        """The transaction on the loop's thread, after a checkpoint (so that
        the caller can still be cancelled before it starts).

        Past a backlog the transactions take turns, one per pass of the
        scheduler: the loop runs every ready task once per pass, so a
        thousand handlers reaching their transaction together would make one
        pass of seconds, in which no connection is accepted and no request
        read. Taking turns keeps each pass short; below the backlog the turn
        would only cost a hand-off per transaction.
        """
        self._inline_pending += 1
        try:
            if self._inline_pending > INLINE_TURNS_BACKLOG:
                async with self._turns:
                    return self._run(self._inline_engine, fn, write, args, kwargs)
            await anyio.lowlevel.checkpoint()
            return self._run(self._inline_engine, fn, write, args, kwargs)
        finally:
            self._inline_pending -= 1

    def run_sync(self, fn: Callable[..., T], write: bool, *args: Any, **kwargs: Any) -> T:
        """The same, in the calling thread (migrations, the CLI)."""
        return self._run(self.engine, fn, write, args, kwargs)

    def _run(self, engine: Engine, fn: Callable[..., T], write: bool, args: Any, kwargs: Any) -> T:
        inline = engine is not self.engine
        for attempt in range(_RETRIES):
            try:
                with engine.connect() as conn:
                    return self._transaction(conn, fn, write, args, kwargs)
            except OperationalError as exc:
                if inline and "locked" in str(exc.orig):
                    raise _Busy from exc
                if _retryable(exc) and attempt < _RETRIES - 1:
                    continue
                raise StorageUnavailable(str(exc.orig)) from exc
            except InterfaceError as exc:
                raise StorageUnavailable(str(exc.orig)) from exc
            except IntegrityError:
                # Two transactions inserting the same unique row at once (the
                # first pops of one new worker name): the retry sees the row.
                if attempt < _RETRIES - 1:
                    continue
                raise
            except DBAPIError as exc:
                if _retryable(exc) and attempt < _RETRIES - 1:
                    continue
                raise
        raise AssertionError("unreachable")

    def _transaction(
        self, conn: Connection, fn: Callable[..., T], write: bool, args: Any, kwargs: Any
    ) -> T:
        if not (write or self.is_sqlite):
            # A read on PostgreSQL: its statements in autocommit (see
            # _postgresql_engine).
            return fn(Tx(conn), *args, **kwargs)
        conn = conn.execution_options(hordelite_write=write)
        with conn.begin():
            tx = Tx(conn, begin=None if self.is_sqlite else BEGIN_WRITE)
            result = fn(tx, *args, **kwargs)
            tx.commit_deferred()
            return result

    def dispose(self) -> None:
        self.engine.dispose()
        if self.is_sqlite:
            self._inline_engine.dispose()


class _Busy(HordeliteError):
    """Another process holds the SQLite file: retry where waiting is allowed."""


# A write transaction's first words on PostgreSQL (the connection's default
# is read-only, see _postgresql_engine).
BEGIN_WRITE = "BEGIN READ WRITE"


def _ping(conn: Tx) -> None:
    conn.exec_driver_sql("SELECT 1")


def _retryable(exc: DBAPIError) -> bool:
    # PostgreSQL deadlock_detected / serialization_failure.
    return getattr(exc.orig, "sqlstate", None) in ("40P01", "40001")


def _postgresql_engine(url: str, pool_size: int, prepare: bool) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        # Every transaction ends in commit or rollback already.
        pool_reset_on_return=None,
    )

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        # psycopg's connection, its waits awaited when run on the loop.
        return _on_loop.connect(*cargs, **cparams)

    @event.listens_for(engine, "connect")
    def _autocommit_read_only_unless_written(dbapi_conn: Any, _record: Any) -> None:
        # The connection stays in autocommit: psycopg sends no BEGIN of its
        # own, and hordelite says where a transaction starts.
        #  - A read's statements each run as their own transaction, without
        #    the BEGIN and COMMIT round trips (two of a status read's four).
        #    At READ COMMITTED, PostgreSQL's default and the horde's, every
        #    statement of a transaction reads its own snapshot anyway, so
        #    they see what they would have seen inside one; and a read takes
        #    no locks to hold until a commit. The connection's default is
        #    read-only, so a statement that would write in a read is refused
        #    by the server, not committed on its own.
        #  - A write transaction says BEGIN READ WRITE, deferred (Tx.defer):
        #    it goes with the transaction's first statement, in one round
        #    trip, and its COMMIT with its last writes.
        dbapi_conn.autocommit = True
        dbapi_conn.execute("SET default_transaction_read_only = on")
        # hordelite prepares its plans itself (_libpq). psycopg's own
        # prepared statements would cost them theirs: a rollback, once
        # psycopg has prepared any, sends DEALLOCATE ALL.
        dbapi_conn.prepare_threshold = None
        if not prepare:
            dbapi_conn.prepared_max = 0

    return engine


def _sqlite_engine(url: str, pool_size: int, busy_timeout_ms: int = 30000) -> Engine:
    engine = create_engine(
        url,
        poolclass=QueuePool,
        pool_size=pool_size + 1,
        max_overflow=0,
        # Every transaction ends in commit or rollback already.
        pool_reset_on_return=None,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transactions into our own hands (the driver's implicit BEGIN
        # would be DEFERRED), then set the journal up.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("hordelite_write", True)
        statement = "BEGIN IMMEDIATE" if write else "BEGIN"
        # On the driver itself: SQLAlchemy's execution machinery would cost
        # more than the statement. Its error is raised as SQLAlchemy's (a
        # locked file is an OperationalError, which Database._run reads).
        try:
            conn.connection.driver_connection.execute(statement)  # type: ignore[union-attr]
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc

    return engine
