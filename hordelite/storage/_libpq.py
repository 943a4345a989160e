"""Prepared plans sent straight to libpq (PostgreSQL's side of ``Tx``).

psycopg's cursor does per statement what a prepared plan has already done
once: it builds a cursor, a transformer with its own adapters map, converts
the query, looks the statement up in its prepare cache, and keeps the rows
for the DBAPI's fetch calls; a pipeline is one more object with queues of
its own. On the PostgreSQL text cycle that machinery took more of the
server's CPU than SQLite's statements did (docs/performance.md, "A thin
path on libpq").

Here each connection keeps one transformer (its dumpers, found once per
Python type, and its loaders) and the names of the statements it has
prepared, and every batch of statements (a transaction's deferred writes
with the statement or the ``COMMIT`` that follows them, or one statement
alone) goes to the server as one pipeline: a new statement's ``PREPARE``
goes with its first run, then one Sync, and the replies are read in one
pass. The SQL is the plan's, as SQLAlchemy wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

from psycopg import errors as pg_errors
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus
from psycopg.waiting import READY_R, WAIT_R, WAIT_RW

# A connection prepares at most this many statements (a statement prepared
# once per set of parameter types: an int may go as int2, int4 or int8);
# past it, new ones run unprepared. hordelite's plans need a few dozen.
PREPARED_MAX = 512

_OK = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


class Statement(NamedTuple):
    """One statement of a batch: its SQL with ``$n`` parameters and their
    values (a list of value lists when ``many``); ``values`` None for SQL
    sent as it is (``BEGIN READ WRITE``, ``COMMIT``)."""

    sql: str
    values: Any
    many: bool


class Fetched:
    """The replies of a batch's last statement, as the fast path's
    ``Result`` reads a cursor: ``rowcount``, ``description`` (each
    column's type as the server reports it), ``fetchone``, ``fetchall``."""

    __slots__ = ("_at", "_reply", "_rows", "rowcount")

    def __init__(self, reply: Any, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._reply = reply
        self._rows = rows
        self._at = 0
        self.rowcount = rowcount

    @property
    def description(self) -> list[tuple[None, int]] | None:
        reply = self._reply
        if reply is None or not reply.nfields:
            return None
        return [(None, reply.ftype(i)) for i in range(reply.nfields)]

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._at = self._rows[self._at :], len(self._rows)
        return rows

    def close(self) -> None:
        pass


class _Command(NamedTuple):
    """One command put in the pipeline: a ``PREPARE`` (its ``key`` and
    ``name`` kept once it succeeds), a run of a prepared ``name``, or SQL
    sent unprepared (``name`` empty); ``item`` is the batch's statement it
    belongs to."""

    prepare: bool
    key: tuple[str, tuple[int, ...]] | None
    name: bytes
    sql: bytes
    params: Any
    types: Any
    formats: Any
    item: int

    def send(self, pgconn: Any) -> None:
        if self.prepare:
            pgconn.send_prepare(self.name, self.sql, param_types=self.types)
        elif self.name:
            pgconn.send_query_prepared(self.name, self.params, param_formats=self.formats)
        else:
            pgconn.send_query_params(
                self.sql, self.params, param_types=self.types, param_formats=self.formats
            )


class Statements:
    """One connection's prepared statements and transformer (see the module)."""

    def __init__(self, driver: Any, prepared_max: int = PREPARED_MAX) -> None:
        self._driver = driver
        # Statements prepared at most (0: none, storage.prepared_statements
        # false); past it, new ones go unprepared.
        self.prepared_max = prepared_max
        self._transformer = Transformer(driver)
        self._names: dict[tuple[str, tuple[int, ...]], bytes] = {}
        # Names are never reused on a connection: one dropped by hand while
        # others stay (DEALLOCATE hl_3) must not be prepared over them.
        self._numbers = itertools.count()

    def run(self, batch: Sequence[Statement]) -> Fetched:
        """Send ``batch`` in one pipeline and read every reply; the first
        error the server answered is raised (psycopg's exception), after
        all the replies are read. Returns the last statement's rows."""
        commands = self._commands(batch)
        pgconn = self._driver.pgconn
        pgconn.enter_pipeline_mode()
        try:
            for command in commands:
                command.send(pgconn)
            pgconn.pipeline_sync()
            replies = self._driver.wait(_round_trip(pgconn))
        except BaseException:
            # Replies left unread: the connection cannot be used again
            # (closed, SQLAlchemy's pool then drops it as disconnected).
            self._driver.close()
            raise
        pgconn.exit_pipeline_mode()
        return self._read(commands, replies, len(batch) - 1)

    def _commands(self, batch: Sequence[Statement]) -> list[_Command]:
        """Each statement's values dumped before anything is sent (a value
        that cannot be sent fails here, with nothing in the pipeline)."""
        tx = self._transformer
        commands = []
        preparing: dict[tuple[str, tuple[int, ...]], bytes] = {}
        for item, (sql, values, many) in enumerate(batch):
            encoded = sql.encode()
            if values is None:
                commands.append(_Command(False, None, b"", encoded, None, None, None, item))
                continue
            for one in values if many else (values,):
                params = tx.dump_sequence(one, [PyFormat.AUTO] * len(one))
                types, formats = tx.types or (), tx.formats
                key = (sql, types)
                name = self._names.get(key) or preparing.get(key)
                if name is None and len(self._names) + len(preparing) < self.prepared_max:
                    name = preparing[key] = b"hl_%d" % next(self._numbers)
                    commands.append(_Command(True, key, name, encoded, None, types, None, item))
                commands.append(
                    _Command(False, None, name or b"", encoded, params, types, formats, item)
                )
        return commands

    def _read(self, sent: list[_Command], replies: list[list[Any]], item: int) -> Fetched:
        """Names of the statements prepared kept; the first error raised;
        the rows of the statement ``item`` read (its row count summed over
        its runs, as psycopg's ``executemany`` does)."""
        failed = None
        last: Any = None
        rowcount = 0
        for command, results in zip(sent, replies, strict=True):
            for reply in results:
                status = reply.status
                if status in _OK:
                    if command.prepare:
                        assert command.key is not None
                        self._names[command.key] = command.name
                    elif command.item == item:
                        last = reply
                        rowcount += reply.command_tuples or 0
                elif status == ExecStatus.FATAL_ERROR and failed is None:
                    failed = reply
        if failed is not None:
            error = pg_errors.error_from_result(failed, encoding=self._driver.info.encoding)
            if isinstance(error, pg_errors.InvalidSqlStatementName):
                # The session's statements were dropped (DEALLOCATE ALL,
                # DISCARD ALL by hand): the next batch prepares its own.
                self._names.clear()
            raise error
        if last is None or not last.nfields:
            return Fetched(last, [], rowcount)
        tx = self._transformer
        tx.set_pgresult(last)
        return Fetched(last, tx.load_rows(0, last.ntuples, tuple), rowcount)


def _round_trip(pgconn: Any) -> Generator[int, int, list[list[Any]]]:
    """Send what the pipeline holds, then read each command's replies up
    to the Sync's (psycopg's waits: the caller's connection awaits each
    socket wait on the loop, or blocks off it)."""
    while pgconn.flush():
        if (yield WAIT_RW) & READY_R:
            pgconn.consume_input()
    replies: list[list[Any]] = []
    current: list[Any] = []
    while True:
        if pgconn.is_busy():
            yield WAIT_R
            pgconn.consume_input()
            continue
        reply = pgconn.get_result()
        if reply is None:
            replies.append(current)
            current = []
        elif reply.status == ExecStatus.PIPELINE_SYNC:
            return replies
        else:
            current.append(reply)
