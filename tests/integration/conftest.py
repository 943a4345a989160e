"""Fixtures shared by the integration suites."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import _env


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str | None:
    """The test's database, on both loops: None (a temporary SQLite file,
    open_horde's own) or a PostgreSQL schema of the test's own, migrated and
    empty (skipped without HORDELITE_TEST_POSTGRES_URL). A module may define
    its own."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("migrated_schema_url"))


@pytest.fixture(params=["sqlite", "postgresql"])
def chat_database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """Run the test on SQLite (a temporary file) and on PostgreSQL (a schema
    of its own, migrated and empty, skipped without
    HORDELITE_TEST_POSTGRES_URL): the hordes the set-ups of
    tests/integration/_env.py open use it."""
    url: str | None = None
    if request.param == "postgresql":
        url = request.getfixturevalue("migrated_schema_url")
    _env.select_database(url)
    try:
        yield url
    finally:
        _env.select_database(None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The event loop does not reach the database (queries run on the storage
    # layer's threads or inline, the same on either loop), so a chat test on
    # PostgreSQL runs on trio only: the whole chat suite then costs PostgreSQL
    # about a minute, not two. Both loops still run every chat test on SQLite.
    kept, dropped = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        params = params.params if params is not None else {}
        if params.get("chat_database") == "postgresql" and params.get("anyio_backend") != "trio":
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# Files the tests kept for a person to look at (the dashboard's screenshots),
# listed at the end of the run.
ARTIFACT_PATHS: list[Path] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ARTIFACT_PATHS:
        terminalreporter.section("test artifacts")
        for path in ARTIFACT_PATHS:
            terminalreporter.write_line(str(path))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist worker hands its list to the controller (tests/conftest.py).
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["artifacts"] = [str(path) for path in ARTIFACT_PATHS]
