"""The route table (hordelite/http/routes.py): every route listed once,
each refusal in its route's envelope, and what the one dispatcher does for
every route: 404 and 405 in the path's family's envelope, ``HEAD`` as
``GET``, a preflight by the methods the path takes, and a long poll or a
held call whose client left cancelled."""

from __future__ import annotations

import json
import re

import anyio
import httpx
import pytest
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.errors import RC
from hordelite.front.openai import OpenAIRoutes
from hordelite.http import envelopes
from hordelite.http.dispatch import Route
from hordelite.http.routes import horde_app, horde_routes
from hordelite.storage.schema import requests
from hordelite.storage.transaction import Tx
from hordelite.testing import FakeChatWorker, FakeTextWorker, TestHorde, open_horde
from tests.integration._helpers import eventually, submit_text, text_status
from tests.integration._raw import connect

pytestmark = pytest.mark.anyio

POP = "/api/v2/generate/text/pop"
CHAT = "/v1/chat/completions"
# Every part of the configuration that adds routes, on.
EVERY_ROUTE = Config().replace(dashboard={"enabled": True}, metrics={"enabled": True})
_PARAMETER = re.compile(r"<(?:path:)?[A-Za-z_]+>")


def _path(route: Route) -> str:
    """A path the route takes: each parameter a plain segment."""
    return _PARAMETER.sub("x", route.template)


def _takes(route: Route, path: str) -> bool:
    """Whether ``route``'s template matches ``path`` (a parameter, any
    segment; a path parameter, any rest): a path such as /filters/regex is
    also /filters/<filter_id>'s."""
    pattern = "".join(
        ".+" if part.startswith("<path:") else "[^/]+" if part.startswith("<") else re.escape(part)
        for part in re.split(r"(<[^>]+>)", route.template)
    )
    return re.fullmatch(pattern, path) is not None


def _family(template: str) -> envelopes.Envelope:
    """The envelope of a path's family: Anthropic's for the Messages API,
    OpenAI's for the rest of /v1, the native one elsewhere."""
    if template == "/v1/messages" or template.startswith("/v1/messages/"):
        return envelopes.anthropic
    return envelopes.openai if template.startswith("/v1") else envelopes.native


def _in_envelope(route: Route, body: object, rc: RC) -> bool:
    if route.envelope is envelopes.anthropic:
        return (
            isinstance(body, dict)
            and body["type"] == "error"
            and body["error"]["code"] == rc.name
            and bool(body["error"]["type"])
        )
    if route.envelope is envelopes.openai:
        return isinstance(body, dict) and body["error"]["code"] == rc.name
    return isinstance(body, dict) and body["rc"] == rc.name and "message" in body


def _table(horde: TestHorde) -> list[Route]:
    served = horde_app(horde.horde)
    return served.dispatcher.table.routes


async def test_every_route_is_listed_once_and_the_shell_serves_only_the_tables_pages() -> None:
    async with open_horde(config=EVERY_ROUTE) as horde:
        served = horde_app(horde.horde)
        routes = served.dispatcher.table.routes
        keys = [(r.method, r.template) for r in routes]
        assert len(keys) == len(set(keys))
        # The Messages API is Anthropic's family, the rest of /v1 OpenAI's.
        for route in routes:
            assert route.envelope is _family(route.template), route.template
        shell = served.dispatcher._shell
        assert shell is not None
        in_shell = {
            (method, rule.rule)
            for rule in shell.url_map.iter_rules()  # type: ignore[attr-defined]
            for method in rule.methods or ()
            if method not in ("HEAD", "OPTIONS")
        }
        assert in_shell == {(r.method, r.template) for r in routes if r.handler is None}


async def test_each_route_refuses_in_its_own_envelope(anyio_backend: str) -> None:
    """For every route: a method the path does not take is 405, and a query
    value with a NUL is 400 before the handler runs, each in the route's
    envelope (the shell's routes: the 405 only, the dispatcher's)."""
    async with (
        open_horde(config=EVERY_ROUTE) as horde,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        routes = _table(horde)
        taken: dict[str, set[str]] = {}
        for route in routes:
            path = _path(route)
            taken[path] = {r.method for r in routes if _takes(r, path)}
        for route in routes:
            path = _path(route)
            other = next(m for m in ("PATCH", "PUT", "POST", "DELETE") if m not in taken[path])
            refused = await client.request(other, path)
            assert refused.status_code == 405, (other, path)
            assert _in_envelope(route, refused.json(), RC.MethodNotAllowed), (other, path)
            if route.handler is None:
                continue
            refused = await client.request(route.method, path, params={"q": "a\x00b"})
            assert refused.status_code == 400, (route.method, path)
            assert _in_envelope(route, refused.json(), RC.BadRequest), (route.method, path)


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/api/v2/no/such/route", "native"),
        ("/v1/no/such/route", "openai"),
        ("/v1/messages/no/such/route", "anthropic"),
        ("/v1/messagesx", "openai"),
        ("/nowhere", "native"),
    ],
)
async def test_a_path_no_route_has_is_404_in_its_familys_envelope(
    anyio_backend: str, path: str, family: str
) -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url) as client:
        found = await client.get(path)
    assert found.status_code == 404
    body = found.json()
    code = body["rc"] if family == "native" else body["error"]["code"]
    assert code == RC.NotFound.name
    assert (body.get("type") == "error") is (family == "anthropic")


async def test_head_is_get_without_the_body_and_a_preflight_names_the_methods(
    anyio_backend: str,
) -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url) as client:
        got = await client.get("/api/v2/status/heartbeat")
        head = await client.head("/api/v2/status/heartbeat")
        options = await client.options("/api/v2/users/1")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(got.content))
    assert options.status_code == 200
    assert set(options.headers["allow"].split(", ")) == {"GET", "HEAD", "PUT", "OPTIONS"}


async def test_the_shells_pages_get_the_cors_headers_and_are_counted_as_any_route() -> None:
    """The dispatcher hands ``GET /`` and the static files to Quart, and
    adds to their answers what it adds to its own: the CORS headers by
    ``server.cors_origins`` (with Vary: Origin) and the metrics' count."""
    listed = "https://chat.example.org"
    config = EVERY_ROUTE.replace(server={"cors_origins": listed})
    async with open_horde(config=config) as horde, httpx.AsyncClient(base_url=horde.url) as client:
        page = await client.get("/", headers={"Origin": listed})
        static = await client.get("/dashboard/static/dashboard.css", headers={"Origin": listed})
        other = await client.get("/", headers={"Origin": "https://evil.example"})
        counted = {
            (s.labels["route"], s.labels["status"]): s.value
            for family in horde.horde.metrics.http_requests.collect()
            for s in family.samples
            if s.name.endswith("_total")
        }
    for answer in (page, static):
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == listed
        assert "Origin" in [v.strip() for v in answer.headers["vary"].split(",")]
        # The page's own headers, which the shell adds.
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "access-control-allow-origin" not in other.headers
    assert counted[("/", "200")] == 2
    assert counted[("/dashboard/static/<path:filename>", "200")] == 1


async def test_a_route_that_takes_the_path_but_not_the_method_gives_way() -> None:
    """``PUT /workers/messages`` is the worker route's (``<worker_id>`` =
    "messages"), as Werkzeug's map had it: not a 405 of the messages route."""
    async with open_horde() as horde:
        table = horde_app(horde.horde).dispatcher.table
        route, params, _ = table.match("PUT", "/api/v2/workers/messages")
        assert route is not None
        assert route.template == "/api/v2/workers/<worker_id>"
        assert params == {"worker_id": "messages"}
        route, _, allowed = table.match("PATCH", "/api/v2/workers/messages")
        assert route is None
        assert set(allowed) == {"GET", "POST", "PUT", "DELETE"}


async def test_the_table_lists_the_routes_the_configuration_turns_on() -> None:
    off = Config().replace(dashboard={"enabled": False}, metrics={"enabled": False})
    async with open_horde(config=off) as horde:
        routes = horde_routes(horde.horde, OpenAIRoutes(horde.horde), None)
    listed = {r.template for r in routes}
    # Without the page, the root answers only HEAD (Claude Code's probe).
    assert [r.method for r in routes if r.template == "/"] == ["HEAD"]
    assert "/metrics" not in listed
    assert not any(t.startswith("/blobs") for t in listed)
    async with open_horde(config=EVERY_ROUTE) as horde:
        routes = horde_routes(horde.horde, OpenAIRoutes(horde.horde), None)
    listed = {r.template for r in routes}
    assert {"/", "/metrics", "/dashboard/pool"} <= listed
    assert [r.method for r in routes if r.template == "/"] == ["GET"]


async def test_a_long_polling_pop_whose_worker_left_is_handed_no_job() -> None:
    async with open_horde() as horde:
        key = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        body = json.dumps({"name": "leaver", "models": ["m1"], "wait": 30}).encode()
        async with connect(horde) as conn:
            await conn.send(
                b"POST " + POP.encode() + b" HTTP/1.1\r\nHost: t\r\n"
                b"apikey: " + owner.encode() + b"\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            # The pop checks the worker in before it waits.
            await eventually(lambda: _online(horde, "leaver"))
        # Gone. A request queued now must wait for a worker still there.
        async with httpx.AsyncClient(base_url=horde.url) as client:
            request_id = await submit_text(client, key, "Anyone?", models=["m1"])
            async with FakeTextWorker(horde.url, owner, name="stayer", models=["m1"]) as worker:
                with anyio.fail_after(10):
                    job = await worker.pop()
                assert job["id"] is not None
                assert job["payload"]["prompt"] == "Anyone?"
            assert (await text_status(client, request_id))["processing"] == 1


async def test_an_openai_call_whose_client_left_cancels_its_request() -> None:
    async with open_horde() as horde:
        key = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with FakeChatWorker(horde.url, owner) as worker:
            await worker.pop()
            body = json.dumps(
                {"model": "fake-chat-model", "messages": [{"role": "user", "content": "Hi"}]}
            ).encode()
            async with connect(horde) as conn:
                await conn.send(
                    CHAT.encode().join([b"POST ", b" HTTP/1.1\r\nHost: t\r\n"])
                    + f"Authorization: Bearer {key}\r\n".encode()
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await eventually(lambda: _waiting(horde, 1))
            # Gone: its request is cancelled, so the worker finds nothing.
            await eventually(lambda: _waiting(horde, 0))
            assert (await worker.pop())["id"] is None


async def _waiting(horde: TestHorde, count: int) -> bool:
    """Whether ``count`` requests wait."""

    def waiting(conn: Tx) -> int:
        found = conn.execute(select(func.count()).where(requests.c.state == "waiting"))
        return int(found.scalar_one())

    return await horde.horde.db.read(waiting) == count


async def _online(horde: TestHorde, name: str) -> bool:
    async with httpx.AsyncClient(base_url=horde.url) as client:
        listed = (await client.get("/api/v2/workers")).json()
    return any(w["name"] == name and w["online"] for w in listed)
