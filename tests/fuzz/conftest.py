"""One fuzzed horde per backend and module: SQLite on trio, PostgreSQL on asyncio."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import with_search_path
from tests.fuzz._harness import CASES, Fuzzer, running_fuzzer


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def fuzzer(request: pytest.FixtureRequest) -> Iterator[Fuzzer]:
    if request.param == "sqlite":
        with running_fuzzer("trio", None, "sqlite") as fuzzer:
            yield fuzzer
        return
    url = os.environ.get("HORDELITE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HORDELITE_TEST_POSTGRES_URL is not set: the PostgreSQL suite is skipped")
    schema = f"hl_fuzz_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        with running_fuzzer("asyncio", with_search_path(url, schema), "postgresql") as fuzzer:
            yield fuzzer
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if CASES:
        parts = ", ".join(f"{label} {n}" for label, n in sorted(CASES.items()))
        terminalreporter.write_line(f"fuzz tier: {sum(CASES.values())} cases sent ({parts})")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist worker hands its count to the controller (tests/conftest.py).
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["fuzz_cases"] = dict(CASES)
