"""The storage suite runs every test on SQLite (a temporary file) and PostgreSQL.

On PostgreSQL each test gets a schema of its own (``hl_<random>``), selected
with libpq's ``options=-csearch_path=...`` in the URL, and dropped afterwards:
other test runs may share the same database at the same time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.migrations import upgrade
from tests.storage.helpers import ANONYMOUS_HASH, NOW


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ``storage.database`` value of an empty database of each kind."""
    if request.param == "sqlite":
        return str(tmp_path / "horde.db")
    return request.getfixturevalue("postgres_schema_url")  # type: ignore[no-any-return]


def _open(url: str) -> Database:
    db = Database(url, pool_size=8)
    if not db.is_sqlite:
        # Isolation rests on the search_path reaching psycopg: check it did.
        schema = db.run_sync(
            lambda conn: conn.exec_driver_sql("SELECT current_schema()").scalar(), False
        )
        assert schema is not None
        assert schema.startswith("hl_"), f"connections are not in the test schema: {schema!r}"
    return db


def _migrate(db: Database) -> Database:
    db.run_sync(upgrade, True)
    db.run_sync(queries.ensure_anonymous, True, ANONYMOUS_HASH, NOW)
    return db


@pytest.fixture
def empty_database(database_url: str) -> Iterator[Database]:
    """A Database over an empty database of each kind, no migration run."""
    db = _open(database_url)
    try:
        yield db
    finally:
        db.dispose()


@pytest.fixture
def database(empty_database: Database) -> Database:
    """A migrated Database of each kind, holding only the anonymous user."""
    return _migrate(empty_database)


@pytest.fixture
def sqlite_database(tmp_path: Path) -> Iterator[Database]:
    """A migrated SQLite Database only, for SQLite-specific checks."""
    db = _open(str(tmp_path / "horde.db"))
    try:
        yield _migrate(db)
    finally:
        db.dispose()


@pytest.fixture
def postgresql_database(postgres_schema_url: str) -> Iterator[Database]:
    """A migrated PostgreSQL Database only, for PostgreSQL-specific checks."""
    db = _open(postgres_schema_url)
    try:
        yield _migrate(db)
    finally:
        db.dispose()
