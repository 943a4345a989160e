"""Shared fixtures: every async test runs on trio and on asyncio."""

from __future__ import annotations

import graphlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

if TYPE_CHECKING:
    from tests.integration._helpers import RedisServer

REDIS_URL_ENV = "HORDELITE_TEST_REDIS_URL"
_WORKER_REDIS: list[RedisServer] = []


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``), each worker gets a redis-server of its
    own and names it in ``HORDELITE_TEST_REDIS_URL``. Keys are per request
    and job, but Redis's pub/sub channels are server-wide, whatever the
    database number: hordes of two workers on one Redis would hear each
    other's ``horde:queue`` wake-ups and ``horde:pool`` resets. A serial run
    uses the Redis the variable names, as before."""
    if hasattr(config, "workerinput") and shutil.which("redis-server"):
        from tests.integration._helpers import RedisServer

        redis = RedisServer()
        redis.start()
        _WORKER_REDIS.append(redis)
        os.environ[REDIS_URL_ENV] = redis.url


def pytest_unconfigure(config: pytest.Config) -> None:
    while _WORKER_REDIS:
        _WORKER_REDIS.pop().kill()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Under pytest-xdist the tiers' end-of-run reports (the fuzz tier's
    cases, the dashboard's screenshots) are counted in the workers, which
    hand them over in ``workeroutput`` (see those conftests); summed here."""
    output = getattr(node, "workeroutput", {})
    if "fuzz_cases" in output:
        from tests.fuzz._harness import CASES

        CASES.update(output["fuzz_cases"])
    if "artifacts" in output:
        from tests.integration import conftest as integration

        integration.ARTIFACT_PATHS.extend(Path(p) for p in output["artifacts"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The xdist controller collects no test folder, so the folders'
    conftests that print the reports are not loaded in it: run theirs here."""
    config = terminalreporter.config
    if not config.pluginmanager.has_plugin("dsession"):
        return  # a serial run, or a worker: the folders' conftests print
    from tests.fuzz import conftest as fuzz
    from tests.integration import conftest as integration

    loaded = config.pluginmanager.get_plugins()
    for folder in (fuzz, integration):
        if folder not in loaded:
            folder.pytest_terminal_summary(terminalreporter)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``postgres`` every test that uses the PostgreSQL test server, so
    that ``-m postgres`` and ``-m "not postgres"`` select them. A test that
    reaches it through a parametrised fixture (``getfixturevalue``) carries
    the mark on that fixture's PostgreSQL parameter instead."""
    for item in items:
        if "postgres_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get("HORDELITE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HORDELITE_TEST_POSTGRES_URL is not set: the PostgreSQL suite is skipped")
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` with libpq's ``options`` set so that every connection uses ``schema``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A postgresql:// URL whose connections live in a fresh, empty schema."""
    schema = f"hl_{secrets.token_hex(8)}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(postgres_url, schema)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class SchemaPool:
    """This process's migrated PostgreSQL schemas, each emptied after its
    test and handed to the next.

    Migrating a new schema costs the server about half a second, and over a
    thousand tests open a horde on a PostgreSQL database of their own;
    emptying a used schema costs a few milliseconds. Emptied is what a
    migration leaves: every table empty but ``schema_version``, and the
    sequences restarted. A schema that cannot be emptied within a few
    seconds (a connection a test left open still holds a lock in it) is
    dropped instead, as a test's schema always was before.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.free: list[str] = []
        self.made: list[str] = []

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        from hordelite.storage.database import Database
        from hordelite.storage.migrations import upgrade

        schema = f"hl_{secrets.token_hex(8)}"
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
        self.made.append(schema)
        db = Database(with_search_path(self.url, schema), 1)
        try:
            db.run_sync(upgrade, True)
        finally:
            db.dispose()
        return schema

    def give_back(self, schema: str) -> None:
        try:
            with psycopg.connect(with_search_path(self.url, schema), autocommit=True) as conn:
                conn.execute("SET lock_timeout = '5s'")
                with conn.transaction():
                    for table in _children_first(conn, schema):
                        conn.execute(f"DELETE FROM {table}")
                    sequences = conn.execute(
                        "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (schema,)
                    ).fetchall()
                    for (sequence,) in sequences:
                        conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
        except psycopg.Error:
            self.drop(schema)
        else:
            self.free.append(schema)

    def drop(self, schema: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        self.made.remove(schema)

    def close(self) -> None:
        for schema in list(self.made):
            self.drop(schema)
        self.free.clear()


def _children_first(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The schema's tables but ``schema_version``, each after every table
    whose foreign keys refer to it: deleted in this order, no key is broken."""
    tables = [
        row[0]
        for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    ]
    edges = conn.execute(
        "SELECT child.relname, parent.relname FROM pg_constraint c"
        " JOIN pg_class child ON child.oid = c.conrelid"
        " JOIN pg_class parent ON parent.oid = c.confrelid"
        " JOIN pg_namespace n ON n.oid = c.connamespace"
        " WHERE c.contype = 'f' AND n.nspname = %s",
        (schema,),
    ).fetchall()
    order: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for table in tables:
        order.add(table)
    for child, parent in edges:
        if child != parent:
            order.add(parent, child)  # the parent waits for its children
    return [table for table in order.static_order() if table != "schema_version"]


@pytest.fixture(scope="session")
def schema_pool() -> Iterator[SchemaPool]:
    url = os.environ.get("HORDELITE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HORDELITE_TEST_POSTGRES_URL is not set: the PostgreSQL suite is skipped")
    pool = SchemaPool(url)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def migrated_schema_url(postgres_url: str, schema_pool: SchemaPool) -> Iterator[str]:
    """A postgresql:// URL whose connections live in a schema of their own,
    migrated and empty, as a horde's first start leaves it (less the
    anonymous user, which the horde creates at its own start)."""
    schema = schema_pool.take()
    try:
        yield with_search_path(postgres_url, schema)
    finally:
        schema_pool.give_back(schema)
