"""A transaction as query functions see it: ``Tx``.

Query functions are written once, as SQLAlchemy Core, for both databases.
SQLAlchemy runs each statement through its execution machinery: a cache key
computed from the statement's tree, a compiled-cache lookup, an execution
context, events, a result object. On the text cycle that machinery cost
more server CPU than SQLite itself (docs/performance.md, "The fast path").

A statement built once, at import, and marked ``prepared`` is compiled once
per database (its SQL, the order of its parameters, their bind processors,
the Python-side column defaults an insert or update fills in, its result
processors) and then run straight on the driver: on SQLite its cursor, on
PostgreSQL libpq itself, the statement prepared once per connection
(``_libpq``, decision 0068). The SQL is still the one SQLAlchemy writes
from the Core statement, only the per-call machinery is skipped. Any other
statement, and a prepared one whose compiled form needs what the fast path
does not do (expanding ``IN`` lists, callable defaults), runs through
SQLAlchemy as before, in the same transaction;
``tests/storage/test_transaction.py`` holds every prepared statement to
having a plan, so that a SQLAlchemy release that changes what a plan reads
fails a test instead of quietly slowing the horde.

A write whose result nobody reads (no rows, no row count) can be deferred
(``Tx.defer``): on PostgreSQL it is held and sent with the transaction's
next statement, or with its COMMIT, in one round trip (libpq's pipeline
mode), so that a transaction's trailing writes cost one wait for the server
instead of one each. The statements still run in the order they were
given, in the same transaction; a deferred write that fails raises at the
statement or the commit it went with, and the transaction rolls back as
before. On SQLite (a statement is a function call) it runs at once.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import psycopg
from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, NoResultFound
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.schema import ColumnDefault
from sqlalchemy.types import TupleType

from hordelite.storage import _libpq
from hordelite.storage._libpq import Statement

S = TypeVar("S", bound=ClauseElement)

# Whether this libpq has pipeline mode (Tx.defer sends statements together).
_PIPELINES = psycopg.Pipeline.is_supported()

# id() of each prepared statement -> the statement (kept alive, so that its
# id is never reused by another object).
_PREPARED: dict[int, ClauseElement] = {}
# (id, dialect name, the parameter names given) -> its plan, or None when the
# fast path cannot run it.
_PLANS: dict[tuple[int, str, frozenset[str]], _Plan | None] = {}


def prepared(statement: S) -> S:
    """Mark a statement built once (at import) to run on the fast path;
    returns it. Mark only statements that are never rebuilt per call: each
    marked one is compiled once per database and kept for good."""
    _PREPARED[id(statement)] = statement
    return statement


def prepared_statements() -> list[ClauseElement]:
    """Every statement marked ``prepared`` (for the test that plans them)."""
    return list(_PREPARED.values())


class MappingRows(Protocol):
    """A result's rows as mappings of their column names."""

    def first(self) -> Mapping[str, Any] | None: ...
    def one(self) -> Mapping[str, Any]: ...
    def all(self) -> Sequence[Mapping[str, Any]]: ...
    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...


class Rows(Protocol):
    """What a statement run on a ``Tx`` answers (SQLAlchemy's result, or
    the fast path's ``Result``): its rows are tuples with their columns as
    attributes."""

    @property
    def rowcount(self) -> int: ...
    def first(self) -> Any: ...
    def one(self) -> Any: ...
    def all(self) -> Sequence[Any]: ...
    def scalar(self) -> Any: ...
    def scalar_one(self) -> Any: ...
    def scalars(self) -> Any: ...
    def mappings(self) -> MappingRows: ...
    def __iter__(self) -> Iterator[Any]: ...


class Tx:
    """One transaction: what a query function runs its statements on.

    ``execute``, ``exec_driver_sql``, ``begin_nested`` and ``dialect`` are
    SQLAlchemy ``Connection``'s; a result offers the subset of SQLAlchemy's
    result the query functions use (``first``, ``one``, ``all``,
    ``scalar``, ``scalar_one``, ``scalars``, ``mappings``, ``rowcount``,
    iteration), rows their attribute, index and tuple access.
    """

    __slots__ = ("_conn", "_deferred", "_driver", "_sqlite", "dialect")

    def __init__(self, conn: Connection, begin: str | None = None) -> None:
        """``begin``: the statement that starts the transaction, on a
        connection in autocommit (PostgreSQL), deferred: sent with the
        transaction's first statement."""
        self._conn = conn
        self.dialect: Dialect = conn.dialect
        self._sqlite = self.dialect.name == "sqlite"
        self._driver: Any = None
        # What is deferred and not sent yet (PostgreSQL): (plan, values,
        # many), or the SQL text of ``begin``.
        self._deferred: list[tuple[_Plan, Any, bool] | str] = []
        if begin is not None:
            self._driver = conn.connection.driver_connection
            self._deferred.append(begin)

    def execute(
        self, statement: Any, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> Rows:
        """Run ``statement`` with ``params`` (a list of them: once each, as
        an ``executemany``); its result (see the class)."""
        planned = self._planned(statement, params)
        if planned is not None:
            return self._run(*planned)
        self._send_deferred()
        return cast(Rows, self._conn.execute(statement, params))

    def defer(
        self, statement: Any, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Run a write whose result nobody reads: on PostgreSQL a prepared
        one goes with the next statement or the commit (see the module);
        anything else runs now."""
        planned = None if self._sqlite else self._planned(statement, params)
        if planned is None or planned[0].row is not None:
            self.execute(statement, params)
            return
        if self._driver is None:
            self._driver = self._conn.connection.driver_connection
        self._deferred.append(planned)

    def commit_deferred(self) -> None:
        """On PostgreSQL, the deferred writes and the COMMIT in one round
        trip: SQLAlchemy's commit that follows finds the transaction ended
        and sends nothing. Without deferred writes it does nothing (the
        commit sends COMMIT alone, if the transaction began); a transaction
        that ran no statement at all never began: nothing is sent."""
        if self._deferred and all(isinstance(d, str) for d in self._deferred):
            self._deferred = []
        if not self._deferred:
            return
        if _PIPELINES:
            self._on_libpq([*self._deferred_batch(), Statement("COMMIT", None, False)], "COMMIT")
            return
        cursor = psycopg.RawCursor(self._driver)
        try:
            self._send_deferred_on_cursors()
            cursor.execute("COMMIT")
        except self.dialect.loaded_dbapi.Error as exc:
            raise self.translated(exc, cursor, "COMMIT", None) from exc

    def _planned(
        self, statement: Any, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
    ) -> tuple[_Plan, Any, bool] | None:
        """A prepared statement's plan, its values and whether they are
        many; None for any other statement."""
        if isinstance(params, Mapping) or params is None:
            plan = _plan_of(statement, self.dialect, params)
            if plan is not None:
                return plan, plan.parameters(params), False
        elif params and _same_keys(params):
            plan = _plan_of(statement, self.dialect, params[0])
            if plan is not None:
                return plan, [plan.parameters(p) for p in params], True
        return None

    def _send_deferred(self) -> None:
        """The deferred writes, now, in one round trip (before a statement
        that cannot go with them)."""
        if not self._deferred:
            return
        if _PIPELINES:
            self._on_libpq(self._deferred_batch(), "(deferred writes)")
            return
        try:
            self._send_deferred_on_cursors()
        except self.dialect.loaded_dbapi.Error as exc:
            raise self.translated(exc, None, "(deferred writes)", None) from exc

    def _on_libpq(self, batch: list[Statement], sql: str, values: Any = None) -> _libpq.Fetched:
        """``batch`` in one pipeline on libpq (``_libpq``): one round trip;
        its last statement's rows. A driver error is raised as SQLAlchemy's,
        naming ``sql`` and ``values``."""
        try:
            return cast(_libpq.Fetched, self._driver.statements.run(batch))
        except self.dialect.loaded_dbapi.Error as exc:
            raise self.translated(exc, None, sql, values) from exc

    def _deferred_batch(self) -> list[Statement]:
        """What was deferred, as statements for ``_libpq``, each heard by
        SQLAlchemy's listeners as it is taken; nothing is left deferred."""
        deferred, self._deferred = self._deferred, []
        batch = []
        for item in deferred:
            if isinstance(item, str):
                batch.append(Statement(item, None, False))
                continue
            plan, values, many = item
            self._heard(None, plan.sql, values, many)
            batch.append(Statement(plan.sql, values, many))
        return batch

    def _send_deferred_on_cursors(self) -> None:
        """Without pipeline mode (libpq before 14): one statement at a time."""
        deferred, self._deferred = self._deferred, []
        for item in deferred:
            cursor = psycopg.RawCursor(self._driver)
            if isinstance(item, str):
                cursor.execute(item)
                continue
            plan, values, many = item
            self._heard(cursor, plan.sql, values, many)
            self._send(cursor, plan.sql, values, many)

    def _heard(self, cursor: Any, sql: str, values: Any, many: bool) -> None:
        conn = self._conn
        if conn._has_events or conn.engine._has_events:
            # Whoever listens to SQLAlchemy's statements (the tests that
            # count them) hears these too.
            conn.dispatch.before_cursor_execute(conn, cursor, sql, values, None, many)

    @staticmethod
    def _send(cursor: Any, sql: str, values: Any, many: bool) -> None:
        if many:
            cursor.executemany(sql, values)
        else:
            cursor.execute(sql, values)

    def _run(self, plan: _Plan, values: Any, many: bool) -> Result:
        """Send a plan's SQL with its values on a cursor of the driver's own."""
        if self._driver is None:
            self._driver = self._conn.connection.driver_connection
        if _PIPELINES and not self._sqlite:
            # The deferred writes go first, in the same round trip.
            batch = self._deferred_batch()
            self._heard(None, plan.sql, values, many)
            batch.append(Statement(plan.sql, values, many))
            return self._result(self._on_libpq(batch, plan.sql, values), plan)
        cursor = self._driver.cursor() if self._sqlite else psycopg.RawCursor(self._driver)
        try:
            if self._deferred:
                self._send_deferred_on_cursors()
            self._heard(cursor, plan.sql, values, many)
            self._send(cursor, plan.sql, values, many)
        except self.dialect.loaded_dbapi.Error as exc:
            raise self.translated(exc, cursor, plan.sql, values) from exc
        return self._result(cursor, plan)

    def _result(self, cursor: Any, plan: _Plan) -> Result:
        """The rows of ``cursor`` (a DBAPI cursor, or ``_libpq``'s replies),
        the plan's result processors read at its first run."""
        if plan.make_row == plan._first_row:
            plan.read_description(cursor.description, self.dialect)
        return Result(cursor, plan, self)

    def translated(self, exc: Exception, cursor: Any, sql: str, values: Any) -> Exception:
        """A driver's error as SQLAlchemy raises it (``IntegrityError``,
        ``OperationalError``...), which callers catch; a lost connection is
        invalidated first, so the pool never hands it out again."""
        lost = self.dialect.is_disconnect(exc, self._driver, cursor)  # type: ignore[arg-type]
        if lost:
            self._conn.invalidate(exc)
        return DBAPIError.instance(
            sql,
            values,
            exc,
            self.dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=self.dialect,
        )

    def exec_driver_sql(self, sql: str, params: Any = None) -> Rows:
        """Run SQL text as it is (SQLAlchemy's ``exec_driver_sql``)."""
        self._send_deferred()
        return cast(Rows, self._conn.exec_driver_sql(sql, params))

    @contextlib.contextmanager
    def begin_nested(self) -> Iterator[None]:
        """A savepoint: rolled back alone when the block raises. What was
        deferred before it is sent first, and what the block deferred before
        it ends, so that each is rolled back with its own."""
        self._send_deferred()
        with self._conn.begin_nested():
            yield
            self._send_deferred()

    @property
    def connection(self) -> Connection:
        """SQLAlchemy's connection under it (for what only SQLAlchemy does:
        DDL, reflection, migrations); deferred writes are sent first."""
        self._send_deferred()
        return self._conn


def _same_keys(params: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every parameter set names the same keys (one plan runs them all)."""
    keys = set(params[0]) if params else set()
    return all(set(p) == keys for p in params)


class Result:
    """The rows of one statement run on the fast path (see ``Tx``)."""

    __slots__ = ("_cursor", "_plan", "_tx", "rowcount")

    def __init__(self, cursor: Any, plan: _Plan, tx: Tx) -> None:
        self._cursor = cursor
        self._plan = plan
        self._tx = tx
        self.rowcount: int = cursor.rowcount

    def _fetch(self, one: bool) -> Any:
        """The next raw row (``one``) or all that are left, driver errors
        translated as at execution (SQLite steps through rows as it fetches)."""
        try:
            return self._cursor.fetchone() if one else self._cursor.fetchall()
        except self._tx.dialect.loaded_dbapi.Error as exc:
            raise self._tx.translated(exc, self._cursor, self._plan.sql, None) from exc

    def _fetchone(self) -> Any:
        if self._plan.row is None:
            return None
        raw = self._fetch(True)
        return None if raw is None else self._plan.make_row(raw)

    def all(self) -> list[Any]:
        if self._plan.row is None:
            return []
        make = self._plan.make_row
        return [make(r) for r in self._fetch(False)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.all())

    def first(self) -> Any:
        row = self._fetchone()
        self._cursor.close()
        return row

    def one(self) -> Any:
        rows = self.all()
        if not rows:
            raise NoResultFound("No row was found when one was required")
        if len(rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when exactly one was required")
        return rows[0]

    def scalar(self) -> Any:
        row = self.first()
        return None if row is None else row[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalars(self) -> _Scalars:
        return _Scalars([row[0] for row in self.all()])

    def mappings(self) -> _Mappings:
        return _Mappings(self)


class _Scalars(list[Any]):
    """The first column of each row: iterable, with ``all`` and ``first``."""

    def all(self) -> list[Any]:
        return list(self)

    def first(self) -> Any:
        return self[0] if self else None


class _Mappings:
    """Each row as a read-only mapping of its column names."""

    __slots__ = ("_result",)

    def __init__(self, result: Result) -> None:
        self._result = result

    def first(self) -> Mapping[str, Any] | None:
        row = self._result.first()
        return None if row is None else row._mapping

    def one(self) -> Mapping[str, Any]:
        return self._result.one()._mapping  # type: ignore[no-any-return]

    def all(self) -> list[Mapping[str, Any]]:
        return [row._mapping for row in self._result.all()]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.all())


class _RowMapping(Mapping[str, Any]):
    """A row's mapping view, by column name."""

    __slots__ = ("_index", "_row")

    def __init__(self, row: tuple[Any, ...], index: dict[str, int]) -> None:
        self._row = row
        self._index = index

    def __getitem__(self, key: str) -> Any:
        return self._row[self._index[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return repr(dict(self))


def _row_class(keys: Sequence[str]) -> type:
    """A tuple class whose attributes are ``keys`` (where they are names)
    and whose ``_mapping`` reads a row by column name, as SQLAlchemy's Row."""
    index = {key: i for i, key in enumerate(keys)}
    attributes: dict[str, Any] = {
        "__slots__": (),
        "_mapping": property(lambda self: _RowMapping(self, index)),
        "_fields": tuple(keys),
    }
    for key, i in index.items():
        if key.isidentifier() and not key.startswith("_"):
            attributes[key] = property(operator.itemgetter(i))
    return type("Row", (tuple,), attributes)


class _Bind(NamedTuple):
    """Where one parameter of the SQL gets its value: ``key`` in the call's
    parameters, or ``value`` (a literal of the statement, or a column's
    default); then ``process`` (the type's bind processor), if any."""

    key: str | None
    value: Any
    process: Callable[[Any], Any] | None


@dataclasses.dataclass(slots=True, eq=False)
class _Plan:
    """A prepared statement compiled for one database (see the module).

    Its result processors are read at its first run: on PostgreSQL some
    depend on the type the server reports for the column (a ``sum`` of
    integers comes back as ``numeric``)."""

    sql: str
    names: list[str]
    binds: list[_Bind]
    positional: bool
    row: type | None
    types: list[Any]
    processors: list[tuple[int, Callable[[Any], Any]]] = dataclasses.field(
        default_factory=list, init=False
    )
    make_row: Callable[[Sequence[Any]], Any] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.make_row = self._first_row

    def _first_row(self, raw: Sequence[Any]) -> Any:
        raise AssertionError("a plan's rows are made once it has read its description")

    def read_description(self, description: Sequence[Any] | None, dialect: Dialect) -> None:
        """Set the result processors from the first run's column types."""
        for i, type_ in enumerate(self.types):
            coltype = description[i][1] if description else None
            process = type_.dialect_impl(dialect).result_processor(dialect, coltype)
            if process is not None:
                self.processors.append((i, process))
        self.make_row = self._converting if self.processors else (self.row or tuple)

    def _converting(self, raw: Sequence[Any]) -> Any:
        values = list(raw)
        for i, process in self.processors:
            values[i] = process(values[i])
        assert self.row is not None
        return self.row(values)

    def parameters(self, params: Mapping[str, Any] | None) -> Any:
        given = params or {}
        values = []
        for bind in self.binds:
            value = bind.value if bind.key is None else given[bind.key]
            values.append(value if bind.process is None else bind.process(value))
        if self.positional:
            return values
        return dict(zip(self.names, values, strict=True))


def _plan_of(statement: Any, dialect: Dialect, params: Mapping[str, Any] | None) -> _Plan | None:
    """The plan of a prepared statement with these parameters; None for any
    other statement, or one the fast path cannot run."""
    ident = id(statement)
    marked = _PREPARED.get(ident)
    if marked is None or marked is not statement:
        return None
    given = frozenset(params or ())
    key = (ident, dialect.name, given)
    try:
        return _PLANS[key]
    except KeyError:
        plan = _PLANS[key] = _make_plan(marked, dialect, given)
        return plan


def _make_plan(statement: ClauseElement, dialect: Dialect, given: frozenset[str]) -> _Plan | None:
    """The statement's plan on ``dialect`` with these parameters given, or
    None when its compiled form needs what the fast path does not do."""
    column_keys = sorted(given) if isinstance(statement, Insert | Update) else None
    compiled = statement.compile(dialect=_compiling_dialect(dialect), column_keys=column_keys)
    if not isinstance(compiled, SQLCompiler) or _needs_sqlalchemy(compiled):
        return None
    binds = _binds(compiled, given)
    if binds is None:
        return None
    names = list(compiled.positiontup or ()) if compiled.positional else list(binds)
    ordered = [binds[name] for name in names]
    columns = compiled._result_columns
    row = _row_class([c.keyname for c in columns]) if columns else None
    types = [c.type for c in columns]
    return _Plan(compiled.string, names, ordered, compiled.positional, row, types)


_POSITIONAL: dict[int, Dialect] = {}


def _compiling_dialect(dialect: Dialect) -> Dialect:
    """The dialect a plan is compiled with: on PostgreSQL a copy of the
    engine's with ``$1``-numbered parameters, which psycopg's raw cursor
    sends as they are (its usual cursor rewrites ``%(name)s`` into them at
    every execution)."""
    if dialect.name != "postgresql":
        return dialect
    found = _POSITIONAL.get(id(dialect))
    if found is None:
        found = copy.copy(dialect)
        found.paramstyle = "numeric_dollar"
        found.positional = True
        found.identifier_preparer = found.preparer(found)
        _POSITIONAL[id(dialect)] = found
    return found


def _needs_sqlalchemy(compiled: SQLCompiler) -> bool:
    """Compiled forms the fast path leaves to SQLAlchemy: parameters
    rendered at execution (expanding ``IN``, literal execution), escaped
    parameter names, many-row inserts."""
    # (SQLAlchemy renders post-compile parameters into the SQL string only
    # when asked to, with compile_kwargs render_postcompile: never here.)
    return bool(
        compiled.post_compile_params
        or compiled.literal_execute_params
        or compiled.escaped_bind_names
        or compiled.for_executemany
    )


def _binds(compiled: SQLCompiler, given: frozenset[str]) -> dict[str, _Bind] | None:
    """Each SQL parameter's source, by its name in the SQL; None when one
    needs a default only SQLAlchemy computes (a callable, a sequence)."""
    defaults = _prefetched_defaults(compiled)
    if defaults is None:
        return None
    dialect = compiled.dialect
    binds: dict[str, _Bind] = {}
    for bindparam, name in compiled.bind_names.items():
        if isinstance(bindparam.type, TupleType):
            return None  # a processor per element: not on the fast path
        process = bindparam.type.dialect_impl(dialect).bind_processor(dialect)
        if bindparam.key in given:
            binds[name] = _Bind(bindparam.key, None, process)
        elif name in given:
            binds[name] = _Bind(name, None, process)
        elif name in defaults:
            binds[name] = _Bind(None, defaults[name], process)
        elif bindparam.required or bindparam.callable is not None:
            return None
        else:
            binds[name] = _Bind(None, bindparam.value, process)
    return binds


def _prefetched_defaults(compiled: SQLCompiler) -> dict[str, Any] | None:
    """The Python-side defaults an insert or update fills in (by parameter
    name), when every one is a constant; None otherwise."""
    defaults: dict[str, Any] = {}
    if not (compiled.insert_prefetch or compiled.update_prefetch):
        return defaults
    key_of = compiled._within_exec_param_key_getter
    for column in compiled.insert_prefetch:
        default = column.default
        if not (isinstance(default, ColumnDefault) and default.is_scalar):
            return None
        defaults[key_of(column)] = default.arg
    for column in compiled.update_prefetch:
        default = column.onupdate
        if not (isinstance(default, ColumnDefault) and default.is_scalar):
            return None
        defaults[key_of(column)] = default.arg
    return defaults


def plan_exists(statement: ClauseElement, dialect: Dialect, params: Sequence[str]) -> bool:
    """Whether ``statement`` runs on the fast path on ``dialect`` with these
    parameter names given (the test that holds every prepared statement)."""
    return _make_plan(statement, dialect, frozenset(params)) is not None
