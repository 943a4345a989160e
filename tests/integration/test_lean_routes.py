"""The lean lane (hordelite/lean.py) answers its routes exactly as the
Quart app does: the same statuses, headers and bodies, accepted or refused;
everything else it leaves to Quart; a long poll whose client left is
cancelled.

The comparisons send each request to the lane and to the Quart app behind
it, both over httpx's ASGI transport on one running horde, so the only
difference is which of the two answers.
"""

from __future__ import annotations

import collections
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import func, select

from hordelite.app import create_app
from hordelite.config import Config
from hordelite.lean import LeanRoutes
from hordelite.storage.schema import requests
from hordelite.storage.transaction import Tx
from hordelite.testing import FakeChatWorker, FakeTextWorker, TestHorde, open_horde
from tests.integration._helpers import eventually, submit_text, text_status
from tests.integration._raw import connect

pytestmark = pytest.mark.anyio

ASYNC = "/api/v2/generate/text/async"
CHAT_ASYNC = "/api/v2/generate/chat/async"
POP = "/api/v2/generate/text/pop"
SUBMIT = "/api/v2/generate/text/submit"
PROGRESS = "/api/v2/generate/text/progress"


class Pair:
    """Two clients of one horde: ``lean`` through the lane, ``quart`` straight to Quart."""

    def __init__(self, horde: TestHorde, backend: str) -> None:
        self.horde = horde
        app = create_app(horde.horde, backend)
        self.lane = LeanRoutes(app, horde.horde, app.config["FRONT_ADMISSION"])
        self.lean = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.lane), base_url="http://t"
        )
        self.quart = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    async def both(self, method: str, path: str, **kwargs: Any) -> tuple[Answer, Answer]:
        """The answers of the lane and of Quart; each also counts the same
        requests and refusals in the metrics."""
        before = self.counted()
        lean = Answer.of(await self.lean.request(method, path, **kwargs))
        between = self.counted()
        quart = Answer.of(await self.quart.request(method, path, **kwargs))
        after = self.counted()
        assert between - before == after - between, (method, path)
        return lean, quart

    def counted(self) -> collections.Counter[tuple[str, ...]]:
        """The metrics' counts of answers (by route, method, status) and of
        refusals (by rc)."""
        counts: collections.Counter[tuple[str, ...]] = collections.Counter()
        metrics = self.horde.horde.metrics
        for counter in (metrics.http_requests, metrics.refusals):
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counts[(sample.name, *sample.labels.values())] += int(sample.value)
        return counts


class Answer:
    """What a client sees of an answer, ids of requests and jobs made alike."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: Any) -> None:
        self.status, self.headers, self.body = status, headers, body

    @classmethod
    def of(cls, response: httpx.Response) -> Answer:
        headers = sorted((k.lower(), v) for k, v in response.headers.items())
        text = response.text
        for word in text.split('"'):
            if _is_uuid(word):
                text = text.replace(word, "<id>")
        headers = [(k, v) for k, v in headers if k != "content-length"]
        return cls(response.status_code, headers, json.loads(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Answer) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.headers}, {self.body})"


def _is_uuid(word: str) -> bool:
    try:
        uuid.UUID(word)
    except ValueError:
        return False
    return len(word) == 36


@pytest.fixture
async def pair(anyio_backend: str) -> AsyncIterator[tuple[TestHorde, Pair]]:
    async with open_horde() as horde:
        p = Pair(horde, anyio_backend)
        async with p.lean, p.quart:
            yield horde, p


async def test_the_lane_takes_the_plain_shapes_of_its_routes_and_leaves_the_rest_to_quart(
    pair: tuple[TestHorde, Pair],
) -> None:
    _, p = pair

    def scope(
        method: str, path: str, query: bytes = b"", length: bool | None = None
    ) -> dict[str, Any]:
        # A POST declares its body's length, a GET has none, unless told.
        if length is None:
            length = method == "POST"
        headers = [(b"content-length", b"2")] if length else []
        return {
            "type": "http",
            "method": method,
            "path": path,
            "query_string": query,
            "headers": headers,
        }

    taken = [
        scope("POST", ASYNC),
        scope("POST", CHAT_ASYNC),
        scope("POST", POP),
        scope("POST", SUBMIT),
        scope("POST", PROGRESS),
        scope("GET", f"/api/v2/generate/text/status/{uuid.uuid4()}"),
        scope("GET", f"/api/v2/generate/chat/status/{uuid.uuid4()}", b"wait=2.5"),
        {
            **scope("GET", "/api/v2/generate/text/status/abc"),
            "headers": [(b"content-length", b"0")],
        },
    ]
    left = [
        scope("POST", ASYNC, b"x=1"),  # a query
        scope("POST", ASYNC, length=False),  # a chunked body
        scope("POST", ASYNC + "/"),
        scope("PUT", ASYNC),
        scope("HEAD", "/api/v2/generate/text/status/abc"),
        scope("GET", "/api/v2/generate/text/status/a/b"),
        scope("GET", "/api/v2/generate/text/status/caf\u00e9"),
        scope("GET", "/api/v2/generate/text/status/"),
        scope("GET", "/api/v2/generate/image/status/abc"),
        scope("GET", "/api/v2/generate/text/status/abc", b"wait=1&x=2"),
        scope("GET", "/api/v2/generate/text/status/abc", length=True),  # a GET with a body
        {
            **scope("GET", "/api/v2/generate/text/status/abc"),
            "headers": [(b"transfer-encoding", b"chunked")],
        },
        scope("GET", "/api/v2/status/heartbeat"),
        scope("POST", "/v1/chat/completions", b"x=1"),
        scope("POST", "/v1/chat/completions", length=False),
        scope("GET", "/v1/models"),
        scope("POST", "/v1/embeddings"),
    ]
    assert all(p.lane._route(s) is not None for s in taken)
    assert all(p.lane._route(s) is None for s in left)


async def test_submits_and_their_refusals_are_answered_as_quart_answers_them(
    pair: tuple[TestHorde, Pair],
) -> None:
    horde, p = pair
    key = await horde.create_key("alice", kudos=1000)
    body = {"prompt": "Hello", "params": {"max_length": 40}, "models": ["m1"]}
    cases: list[tuple[dict[str, str], Any]] = [
        ({"apikey": key}, body),
        ({"apikey": key}, {**body, "dry_run": True}),
        ({"apikey": key, "Client-Agent": "lean:1:test"}, body),
        ({"apikey": key, "client_agent": "lean:1:test"}, body),
        ({}, body),
        ({"apikey": ""}, body),
        ({"apikey": "x" * 1000}, body),
        ({"apikey": "0000000000"}, body),
        ({"apikey": "not a key"}, body),
        ({"apikey": key, "Idempotency-Key": ""}, body),
        ({"apikey": key, "Idempotency-Key": "k" * 1000}, body),
        ({"apikey": key}, {**body, "prompt": ""}),
        ({"apikey": key}, {**body, "params": {"max_length": -1}}),
        ({"apikey": key}, {**body, "unknown": 1}),
        ({"apikey": key}, [1, 2]),
    ]
    for headers, sent in cases:
        lean, quart = await p.both("POST", ASYNC, headers=headers, json=sent)
        assert lean == quart, (headers, sent)
    raw_cases = [
        b"",
        b"{",
        b"\xff\xfe",
        b'{"prompt": "a\\u0000"}',
        b'"\\ud800"',
        b"[" * 200 + b"]" * 200,
    ]
    for raw in raw_cases:
        lean, quart = await p.both("POST", ASYNC, headers={"apikey": key}, content=raw)
        assert lean == quart, raw
    chat = {"model": "m1", "messages": [{"role": "user", "content": "Hi"}]}
    lean, quart = await p.both("POST", CHAT_ASYNC, headers={"apikey": key}, json=chat)
    assert lean == quart


async def test_a_body_over_the_cap_is_refused_413_by_either() -> None:
    config = Config().replace(server={"max_body_bytes": 1024})
    async with open_horde(config=config) as horde:
        p = Pair(horde, "trio" if _on_trio() else "asyncio")
        async with p.lean, p.quart:
            big = {"prompt": "x" * 5000, "models": ["m1"]}
            lean, quart = await p.both("POST", ASYNC, headers={"apikey": "k"}, json=big)
            assert lean == quart
            assert lean.status == 413
            assert lean.body["rc"] == "PayloadTooLarge"


def _on_trio() -> bool:
    import sniffio

    return sniffio.current_async_library() == "trio"


async def test_status_reads_pops_submits_and_progress_are_answered_as_quart_answers_them(
    pair: tuple[TestHorde, Pair],
) -> None:
    horde, p = pair
    key = await horde.create_key("alice", kudos=1000)
    owner = await horde.create_key("bob")
    status_of = "/api/v2/generate/text/status/"
    async with httpx.AsyncClient(base_url=horde.url) as client:
        request_id = await submit_text(client, key, "Once", models=["m1"])
    for path in (
        status_of + request_id,
        status_of + request_id + "?wait=0",
        status_of + request_id + "?wait=1.2.3",
        status_of + request_id + "?wait=99999",
        status_of + str(uuid.uuid4()),
        status_of + "not-a-uuid",
        "/api/v2/generate/chat/status/" + request_id,
    ):
        lean, quart = await p.both("GET", path)
        assert lean == quart, path
    pops: list[tuple[dict[str, str], Any]] = [
        ({"apikey": owner}, {"name": "w1", "models": ["other"]}),
        ({"apikey": owner}, {"name": "", "models": ["m1"]}),
        ({"apikey": owner}, {"name": "w1", "models": ["m1"], "wait": "soon"}),
        ({"apikey": "0000000000"}, {"name": "w1", "models": ["m1"]}),
        ({"apikey": key, "Origin": "https://a.example"}, {"name": "w1", "models": ["other"]}),
    ]
    for headers, sent in pops:
        lean, quart = await p.both("POST", POP, headers=headers, json=sent)
        assert lean == quart, (headers, sent)
    # One job, popped by the lane: its answer against Quart's of the next one.
    async with httpx.AsyncClient(base_url=horde.url) as client:
        await submit_text(client, key, "Once", models=["m1"])
    pop_body = {"name": "w1", "models": ["m1"], "max_length": 80}
    lean, quart = await p.both("POST", POP, headers={"apikey": owner}, json=pop_body)
    assert lean == quart
    # Both jobs are out: a third pop finds none.
    third = await p.lean.post(POP, headers={"apikey": owner}, json=pop_body)
    assert third.json()["id"] is None
    for sent in (
        {"id": str(uuid.uuid4()), "generation": "x", "state": "ok"},
        {"id": "nope"},
        {"generation": "x"},
    ):
        lean, quart = await p.both("POST", SUBMIT, headers={"apikey": owner}, json=sent)
        assert lean == quart, sent
        lean, quart = await p.both(
            "POST", PROGRESS, headers={"apikey": owner}, json={**sent, "seq": 1}
        )
        assert lean == quart, sent
    assert (await text_status(p.lean, request_id))["processing"] == 1


async def test_the_lane_sends_the_cors_and_vary_headers_of_listed_origins() -> None:
    config = Config().replace(server={"cors_origins": "https://a.example"})
    async with open_horde(config=config) as horde:
        p = Pair(horde, "trio" if _on_trio() else "asyncio")
        async with p.lean, p.quart:
            for origin in ("https://a.example", "https://b.example", None):
                headers = {} if origin is None else {"Origin": origin}
                path = f"/api/v2/generate/text/status/{uuid.uuid4()}"
                lean, quart = await p.both("GET", path, headers=headers)
                assert lean == quart, origin
                assert ("vary", "Origin") in lean.headers


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


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


async def test_openai_calls_and_their_refusals_are_answered_as_quart_answers_them(
    pair: tuple[TestHorde, Pair],
) -> None:
    horde, p = pair
    key = await horde.create_key("alice", kudos=1e6)
    owner = await horde.create_key("bob")
    messages = [{"role": "user", "content": "Name a colour."}]
    auth = {"Authorization": f"Bearer {key}"}
    async with FakeChatWorker(horde.url, owner) as worker:
        await worker.pop()  # its model is served from now
        refused: list[tuple[dict[str, str], Any]] = [
            (auth, {"model": "nope", "messages": messages}),
            (auth, {"model": "fake-chat-model"}),
            (auth, {"model": "fake-chat-model", "messages": messages, "n": 2}),
            (auth, {"model": "fake-chat-model", "messages": messages, "frobnicate": 1}),
            (auth, {"model": "a:b", "messages": messages}),
            ({"Authorization": "Basic x"}, {"model": "fake-chat-model", "messages": messages}),
            (
                {"Authorization": "Bearer not-a-key"},
                {"model": "fake-chat-model", "messages": messages},
            ),
            (auth, [1]),
        ]
        for headers, sent in refused:
            lean, quart = await p.both("POST", CHAT, headers=headers, json=sent)
            assert lean == quart, (headers, sent)
            lean, quart = await p.both("POST", COMPLETIONS, headers=headers, json=sent)
            assert lean == quart, (headers, sent)
        lean, quart = await p.both("POST", CHAT, headers=auth, content=b"{")
        assert lean == quart
        for body in (
            {"model": "fake-chat-model", "messages": messages},
            {"model": "fake-chat-model", "messages": messages, "stream": True},
        ):
            answers = []
            for client in (p.lean, p.quart):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker.serve_one)
                    response = await client.post(CHAT, headers=auth, json=body)
                answers.append(_call_answer(response))
            assert answers[0] == answers[1], body


def _call_answer(response: httpx.Response) -> tuple[int, list[tuple[str, str]], str]:
    """A call's answer with what differs from call to call (ids, times) made alike."""
    text = response.text
    for word in text.replace(",", '"').split('"'):
        if _is_uuid(word.removeprefix("chatcmpl-")):
            text = text.replace(word, "<id>")
    text = re.sub(r'"created": ?[0-9]+', '"created": 0', text)
    headers = sorted(
        (k.lower(), v) for k, v in response.headers.items() if k.lower() != "content-length"
    )
    return response.status_code, headers, text


async def test_an_openai_call_whose_client_left_on_the_lane_cancels_its_request() -> None:
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
