"""Webhooks (decision 0056): a text request's ``webhook`` is called once when
the request ends (done, faulted or cancelled) with the AI Horde's body,
tried again after a failure, owed in storage across a restart and between
replicas, and never sent to a private address unless the operator allows it.

The receiver is a fake of what lies outside the horde: a plain HTTP/1.1
server on loopback that records each call and answers the status it is told.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from hordelite.api import _render
from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.contract.limits import (
    ANONYMOUS_API_KEY,
    WEBHOOK_BACKOFF,
    WEBHOOK_CALLS_PER_REQUESTER,
    WEBHOOK_CLAIM_BATCH,
    WEBHOOK_TRIES,
)
from hordelite.outbound.guarded_fetch import open_call_client, post_json
from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, eventually

pytestmark = pytest.mark.anyio

CALL_PRIVATE = Config().replace(webhooks={"call_private": True})


class Receiver:
    """A webhook receiver on 127.0.0.1: ``calls`` holds each call's body;
    ``statuses`` the statuses to answer, in turn (200 once they run out).
    ``keep_alive``: connections are kept open for further calls
    (``connections`` counts those made); ``hang``: each call is read and
    never answered (``held`` counts those waiting, ``dropped`` those the
    horde gave up on)."""

    def __init__(self, *, keep_alive: bool = False, hang: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.statuses: list[int] = []
        self.url = ""
        self.keep_alive = keep_alive
        self.hang = hang
        self.connections = 0
        self.held = 0
        self.most_held = 0
        self.dropped = 0

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with stream:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    try:
                        data += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                data = await self._answer(stream, data)
                if not self.keep_alive:
                    return

    async def _answer(self, stream: anyio.abc.SocketStream, data: bytes) -> bytes:
        """Read one call from ``data`` and ``stream`` and answer it; the bytes past it."""
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            body += await stream.receive()
        self.headers.append(headers)
        self.calls.append(json.loads(body[:length]))
        if self.hang:
            self.held += 1
            self.most_held = max(self.most_held, self.held)
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()  # until the horde gives up and closes it
            self.held -= 1
            self.dropped += 1
            return b""
        status = self.statuses.pop(0) if self.statuses else 200
        close = "keep-alive" if self.keep_alive else "close"
        await stream.send(
            f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: {close}\r\n\r\n".encode()
        )
        return body[length:]


@contextlib.asynccontextmanager
async def receiver(port: int = 0, **options: bool) -> AsyncIterator[Receiver]:
    r = Receiver(**options)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    r.url = f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}/hook"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, r._handle)
        try:
            yield r
        finally:
            tg.cancel_scope.cancel()


async def owed(horde: TestHorde, at: float) -> bool:
    """Whether a webhook call is owed and due at ``at`` (on the horde's clock)."""
    return await horde.horde.store.webhooks_due(now=at)


async def failed_once(horde: TestHorde, clock: ManualClock) -> bool:
    """A call was tried and failed: owed again after its first back-off, not now."""
    now = clock.now()
    return not await owed(horde, now) and await owed(horde, now + WEBHOOK_BACKOFF[0])


async def due_after(horde: TestHorde, clock: ManualClock, delay: float) -> bool:
    """A call was tried, failed and was settled: owed again ``delay`` from
    now, not a moment before. A try still under way is owed again when its
    claim lapses (WEBHOOK_CLAIM_SECONDS), which comes before the longest
    back-off: "owed after ``delay``, not now" alone took it for settled
    (under load, the test then moved the clock past its claim)."""
    now = clock.now()
    return not await owed(horde, now + delay - 0.25) and await owed(horde, now + delay)


async def not_(check: Any) -> bool:
    return not await check


async def submit(
    horde: TestHorde, key: str, webhook: str, *, address: str | None = None, **params: Any
) -> str:
    """Queue a text request with ``webhook``, sent from ``address`` (a
    loopback address) when given."""
    transport = None if address is None else httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(base_url=horde.url, transport=transport) as client:
        r = await client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": key},
            json={"prompt": "Hello", "params": params, "models": ["m1"], "webhook": webhook},
        )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def test_a_done_requests_webhook_is_called_once_with_the_ai_hordes_body(
    chat_database: str | None,
) -> None:
    async with (
        receiver() as hook,
        open_env(config=CALL_PRIVATE, database=chat_database) as env,
    ):
        worker = await env.text_worker("w1")
        request_id = await submit(env.horde, env.requester, hook.url)
        job = await worker.serve_one()
        assert job is not None
        await eventually(lambda: hook.calls)
        call = hook.calls[0]
        assert call["request"] == request_id
        # The AI Horde's state is the generation's; how the request
        # ended is told apart.
        assert (call["state"], call["ended"]) == ("ok", "done")
        assert call["done"] is True
        assert call["id"] == job["id"]
        assert call["text"] == worker.generate(job["payload"]["prompt"])
        assert (call["seed"], call["model"], call["worker_name"]) == (1, "m1", "w1")
        assert call["kudos"] > 0
        assert [g["text"] for g in call["generations"]] == [call["text"]]
        assert hook.headers[0]["content-type"] == "application/json"
        assert hook.headers[0]["webhook-id"] == request_id
        assert hook.headers[0]["webhook-attempt"] == "1"
        # Nothing more is owed: further rounds and sweeps call nothing.
        for _ in range(3):
            await env.horde.sweep()
            assert await env.horde.horde.webhooks.call_due(lambda *a: {}) == 0
        assert len(hook.calls) == 1


async def test_a_cancelled_and_a_faulted_request_each_call_their_webhook_once() -> None:
    async with (
        receiver() as hook,
        open_env(config=CALL_PRIVATE, max_faults=0) as env,
    ):
        worker = await env.text_worker()
        cancelled = await submit(env.horde, env.requester, hook.url)
        async with httpx.AsyncClient(base_url=env.horde.url) as client:
            r = await client.delete(f"/api/v2/generate/text/status/{cancelled}")
            assert r.status_code == 200, r.text
        await eventually(lambda: len(hook.calls) == 1)
        faulted = await submit(env.horde, env.requester, hook.url)
        job = await worker.pop()
        await worker.submit(job["id"], "faulted", state="faulted", seed=-1)
        await eventually(lambda: len(hook.calls) == 2)
        ends = {
            c["request"]: (c["state"], c["ended"], c["faulted"], c["generations"])
            for c in hook.calls
        }
        assert ends == {
            cancelled: ("cancelled", "cancelled", False, []),
            faulted: ("faulted", "faulted", True, []),
        }


async def test_a_failed_call_is_tried_again_after_its_back_off_then_given_up() -> None:
    clock = ManualClock()
    async with receiver() as hook, open_horde(config=CALL_PRIVATE, clock=clock) as horde:
        hook.statuses = [500] * WEBHOOK_TRIES
        key = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with FakeTextWorker(horde.url, owner, models=["m1"]) as worker:
            request_id = await submit(horde, key, hook.url)
            await worker.serve_one()
            await eventually(lambda: len(hook.calls) == 1)
            for tries, delay in enumerate(WEBHOOK_BACKOFF, start=1):
                # Once the try is settled (the receiver hears it first),
                # not before its back-off: a round now calls nothing.
                await eventually(lambda delay=delay: due_after(horde, clock, delay))  # type: ignore[misc]
                clock.advance(delay - 0.5)
                horde.horde.core.webhooks_due.set()
                assert await horde.horde.webhooks.call_due(lambda *a: {}) == 0
                assert len(hook.calls) == tries
                clock.advance(0.5)
                await eventually(lambda tries=tries: len(hook.calls) == tries + 1)  # type: ignore[misc]
            # Given up after WEBHOOK_TRIES (once its last try is settled): no
            # later round calls it again.
            await eventually(lambda: not_(owed(horde, clock.now() + 3600)))
            clock.advance(3600)
            assert await horde.horde.webhooks.call_due(lambda *a: {}) == 0
            assert len(hook.calls) == WEBHOOK_TRIES
        # Every try carries the same delivery id, and which try it is.
        assert {h["webhook-id"] for h in hook.headers} == {request_id}
        assert [h["webhook-attempt"] for h in hook.headers] == [
            str(n) for n in range(1, WEBHOOK_TRIES + 1)
        ]


async def test_an_owed_call_survives_a_restart_and_is_made_by_the_next_process() -> None:
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as tmp:
        database = str(Path(tmp) / "horde.db")
        # The receiver is down for the first process: its call fails.
        async with receiver() as probe:
            port = int(probe.url.split(":")[2].split("/")[0])
        url = f"http://127.0.0.1:{port}/hook"
        async with open_horde(config=CALL_PRIVATE, clock=clock, database=database) as horde:
            key = await horde.create_key("alice", kudos=100)
            owner = await horde.create_key("bob")
            async with FakeTextWorker(horde.url, owner, models=["m1"]) as worker:
                request_id = await submit(horde, key, url)
                await worker.serve_one()
            await eventually(lambda: failed_once(horde, clock))
        clock.advance(WEBHOOK_BACKOFF[0])
        async with (
            receiver(port) as hook,
            open_horde(config=CALL_PRIVATE, clock=clock, database=database),
        ):
            await eventually(lambda: hook.calls)
        assert [c["request"] for c in hook.calls] == [request_id]


@pytest.mark.parametrize(
    ("hanging_from", "good_from"),
    [
        pytest.param(None, None, id="users"),
        # Each anonymous client address is a requester of its own (decision 0071).
        pytest.param("127.0.0.2", "127.0.0.3", id="anonymous addresses"),
    ],
)
async def test_one_requesters_hanging_receivers_delay_no_other_requesters_webhook(
    hanging_from: str | None, good_from: str | None
) -> None:
    """Calls are made each on its own, at most WEBHOOK_CALLS_PER_REQUESTER of
    one requester's at once: the calls of a requester whose receiver never
    answers hold those few, and another requester's webhook is called at
    once, not after they time out (WEBHOOK_TIMEOUT). A requester is a user,
    or (sent with the anonymous key) one client address."""
    async with (
        receiver(hang=True) as hanging,
        receiver() as good,
        open_horde(config=CALL_PRIVATE) as horde,
    ):
        anonymous = hanging_from is not None
        mallory = ANONYMOUS_API_KEY if anonymous else await horde.create_key("mallory", kudos=1000)
        alice = ANONYMOUS_API_KEY if anonymous else await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        many = WEBHOOK_CLAIM_BATCH + WEBHOOK_CALLS_PER_REQUESTER
        async with FakeTextWorker(horde.url, owner, models=["m1"]) as worker:
            for _ in range(many):
                await submit(horde, mallory, hanging.url, address=hanging_from)
            for _ in range(many):
                await worker.serve_one()
            await eventually(lambda: hanging.held == WEBHOOK_CALLS_PER_REQUESTER)
            request_id = await submit(horde, alice, good.url, address=good_from)
            await worker.serve_one()
            await eventually(lambda: good.calls)
        assert [c["request"] for c in good.calls] == [request_id]
        # Called while every hanging call was still waiting for its answer.
        assert hanging.dropped == 0
        assert hanging.most_held == WEBHOOK_CALLS_PER_REQUESTER


async def test_calls_share_one_client_and_its_connections() -> None:
    """One client for every call: consecutive calls to a receiver that keeps
    its connections open reuse one, where a client built per call opened a
    connection (and loaded the certificate store) for each."""
    async with (
        receiver(keep_alive=True) as hook,
        open_env(config=CALL_PRIVATE) as env,
    ):
        worker = await env.text_worker()
        for calls in (1, 2, 3):
            await submit(env.horde, env.requester, hook.url)
            await worker.serve_one()
            await eventually(lambda calls=calls: len(hook.calls) == calls)  # type: ignore[misc]
        assert hook.connections == 1


async def test_a_connection_the_shared_client_holds_is_no_way_past_the_address_policy() -> None:
    """The client's pool holds a connection to the receiver's address, made
    by a call the policy allowed: a call there that the policy refuses is
    still refused, before anything is sent."""
    async with receiver(keep_alive=True) as hook, open_call_client(4) as client:
        allowed = await post_json(
            client, hook.url, b"{}", allow_private=True, time_limit=5, headers={}
        )
        assert allowed.answered
        refused = await post_json(
            client, hook.url, b"{}", allow_private=False, time_limit=5, headers={}
        )
        assert (refused.answered, refused.reason, refused.final) == (False, "address", True)
        assert (len(hook.calls), hook.connections) == (1, 1)


@pytest.mark.parametrize(
    ("scheme", "closes"), [("https", True), ("http", False)], ids=["https", "http"]
)
async def test_a_call_goes_to_the_checked_address_and_an_https_one_to_a_name_is_not_pooled(
    scheme: str, closes: bool
) -> None:
    """The request names the checked address (the pool is keyed by it), the
    host's name goes as Host (and SNI); an https connection made for a name
    is closed after its answer, as its certificate was verified for that name
    only. The transport stands for the network: it records what would be sent."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204, stream=httpx.ByteStream(b""))

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        outcome = await post_json(
            client,
            f"{scheme}://localhost:8443/hook",
            b"{}",
            allow_private=True,
            time_limit=5,
            headers={"Webhook-Id": "r1"},
        )
    assert outcome.answered
    [request] = sent
    assert request.url.host in ("127.0.0.1", "::1")
    assert request.headers["host"] == "localhost:8443"
    assert request.headers["webhook-id"] == "r1"
    assert (request.headers.get("connection") == "close") is closes
    if scheme == "https":
        assert request.extensions["sni_hostname"] == "localhost"


async def test_a_webhook_at_a_private_address_is_never_called_unless_allowed() -> None:
    async with (
        receiver() as hook,
        open_env() as env,
    ):
        https_loopback = hook.url.replace("http://", "https://")
        async with FakeTextWorker(env.horde.url, env.owner, models=["m1"]) as worker:
            await submit(env.horde, env.requester, https_loopback)
            await worker.serve_one()
            assert await owed(env.horde, env.horde.horde.clock.now() + 3600)
            # Settled at once, as refused: owed no more, never retried.
            await eventually(lambda: not_(owed(env.horde, env.horde.horde.clock.now() + 3600)))
        assert hook.calls == []


async def test_a_plain_http_webhook_is_refused_at_submit_unless_private_calls_are_allowed() -> None:
    async with open_env() as env:
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": env.requester},
            json={"prompt": "Hi", "webhook": "http://example.org/hook"},
        )
        assert_refused(r, 400, "BadRequest")
        assert "webhook" in r.json()["message"]


async def test_replicas_on_one_database_call_each_webhook_exactly_once(
    postgres_schema_url: str,
) -> None:
    async with (
        receiver() as hook,
        open_horde(config=CALL_PRIVATE, database=postgres_schema_url) as one,
        open_horde(config=CALL_PRIVATE, database=postgres_schema_url) as two,
    ):
        key = await one.create_key("alice", kudos=1000)
        owner = await one.create_key("bob")
        ids = [await submit(one, key, hook.url) for _ in range(10)]
        async with FakeTextWorker(one.url, owner, models=["m1"]) as worker:
            for _ in range(10):
                await worker.serve_one()
            # Both replicas' rounds claim at once, beside their own loops.
            async with anyio.create_task_group() as tg:
                for replica in (one, two, one, two):
                    tg.start_soon(replica.horde.webhooks.call_due, _render.webhook)
        later = one.horde.clock.now() + 3600
        await eventually(lambda: not_(owed(one, later)))
        assert sorted(c["request"] for c in hook.calls) == sorted(ids)
