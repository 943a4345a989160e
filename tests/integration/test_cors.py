"""``server.cors_origins``: which web pages' scripts may read the horde's
answers. ``*`` (the default) answers every origin; a list answers only the
origins it names, by name, with ``Vary: Origin``."""

from __future__ import annotations

import pytest

from hordelite.config import Config
from tests.integration._env import open_env

pytestmark = pytest.mark.anyio

LISTED = "https://chat.example.org"
ROUTES = [
    ("GET", "/api/v2/status/heartbeat"),  # an answer
    ("GET", "/api/v2/no/such/route"),  # a refusal
    ("GET", "/v1/models"),  # the OpenAI front
]


def preflight(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "apikey, content-type",
    }


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_by_default_every_origin_may_read_every_answer(
    anyio_backend: str, method: str, path: str
) -> None:
    async with open_env() as env:
        r = await env.client.request(method, path, headers={"Origin": "https://any.example"})
        assert r.headers["access-control-allow-origin"] == "*"
        options = await env.client.options("/api/v2/generate/text/async", headers=preflight(LISTED))
    assert options.headers["access-control-allow-origin"] == "*"
    assert "POST" in options.headers["access-control-allow-methods"]
    assert options.headers["access-control-allow-headers"] == "*"


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_a_list_of_origins_answers_a_listed_origin_by_name_and_no_other(
    anyio_backend: str, method: str, path: str
) -> None:
    config = Config().replace(server={"cors_origins": f"{LISTED}, http://127.0.0.1:8080"})
    async with open_env(config=config) as env:
        listed = await env.client.request(method, path, headers={"Origin": LISTED})
        other = await env.client.request(method, path, headers={"Origin": "https://evil.example"})
        none = await env.client.request(method, path)
    assert listed.headers["access-control-allow-origin"] == LISTED
    for r in (other, none):
        assert "access-control-allow-origin" not in r.headers
    # Each answer depends on the Origin: caches must keep them apart.
    for r in (listed, other, none):
        assert "Origin" in [v.strip() for v in r.headers["vary"].split(",")]


async def test_a_preflight_is_granted_only_to_a_listed_origin(anyio_backend: str) -> None:
    config = Config().replace(server={"cors_origins": LISTED})
    async with open_env(config=config) as env:
        granted = await env.client.options("/api/v2/generate/text/async", headers=preflight(LISTED))
        refused = await env.client.options(
            "/api/v2/generate/text/async", headers=preflight("https://evil.example")
        )
    assert granted.headers["access-control-allow-origin"] == LISTED
    assert "POST" in granted.headers["access-control-allow-methods"]
    assert "access-control-allow-origin" not in refused.headers
    assert "access-control-allow-methods" not in refused.headers


async def test_an_empty_list_lets_no_other_origin_read_anything(anyio_backend: str) -> None:
    config = Config().replace(server={"cors_origins": ""})
    async with open_env(config=config) as env:
        r = await env.client.get("/api/v2/status/heartbeat", headers={"Origin": LISTED})
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers
