"""Shared fixtures: every async test runs on trio and on asyncio."""

from __future__ import annotations

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
