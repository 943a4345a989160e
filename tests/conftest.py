"""Shared fixtures: every async test runs on trio and on asyncio."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get("HORDELITE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HORDELITE_TEST_POSTGRES_URL is not set: the PostgreSQL suite is skipped")
    return url
