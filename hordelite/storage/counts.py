"""Counts kept in rows by key (per minute, per day and model, per client
address), added to in one statement on either database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite

from hordelite.storage.transaction import Tx


def add_counts(
    conn: Tx, table: Table, key: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> None:
    """Add each of ``rows``' counts (its columns other than ``key``) to the
    row of ``table`` with its key, inserting that row where there is none.
    Increment, never overwrite: an earlier transaction may have counted
    into the same row."""
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    upsert = dialect.insert(table)
    upsert = upsert.on_conflict_do_update(
        index_elements=[table.c[name] for name in key],
        set_={name: table.c[name] + upsert.excluded[name] for name in rows[0] if name not in key},
    )
    conn.execute(upsert, rows)
