"""Lists of values in SQL, whatever their length: bound as one parameter, or
read from the JSON arrays the workers table stores.

``column.in_(values)`` binds one parameter per value. PostgreSQL's protocol
counts a statement's parameters in 16 bits, so psycopg refuses a statement
with more than 65,535 of them, and SQLite refuses more than its
SQLITE_MAX_VARIABLE_NUMBER (32,766 by default). A list the pool decides
(the models or workers online) has no such bound: with 700 workers of 100
models, a statement naming each served model failed on PostgreSQL. Every
list that grows with the pool is therefore bound here as one parameter (an
array on PostgreSQL, a JSON text on SQLite), or read in the statement
itself (``json_elements``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    String,
    any_,
    bindparam,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import ColumnElement, TableValuedAlias

from hordelite.storage.transaction import Tx


def one_of(conn: Tx, column: ColumnElement[Any], values: Iterable[str]) -> ColumnElement[bool]:
    """``column`` is one of ``values`` (strings), with the values bound as one
    parameter however many there are: ``= ANY(array)`` on PostgreSQL, ``IN``
    the elements of a JSON array on SQLite."""
    listed = list(values)
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam(None, listed, type_=ARRAY(String)))
    elements = func.json_each(bindparam(None, json.dumps(listed), type_=String))
    return column.in_(select(elements.table_valued("value").c.value))


def json_elements(conn: Tx, column: ColumnElement[Any]) -> TableValuedAlias:
    """The elements of a JSON array of strings ``column`` as a table of one
    column, ``value``, to join to the column's own row (the function may
    name the row it is joined to on both databases)."""
    if conn.dialect.name == "postgresql":
        return func.json_array_elements_text(column).table_valued("value")
    return func.json_each(column).table_valued("value")


def by_codepoint(conn: Tx, column: ColumnElement[str]) -> ColumnElement[str]:
    """``column`` ordered by code point, as Python's ``sorted`` orders strings:
    PostgreSQL would otherwise order by the database's locale (SQLite's
    default collation already compares bytes, and UTF-8 keeps code point
    order)."""
    if conn.dialect.name == "postgresql":
        return column.collate("C")
    return column
