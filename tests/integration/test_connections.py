"""Connections are bounded and stay served (issue 9, decision 0027).

Raw sockets against the in-process horde: what a kept-alive connection does
after an early answer, an idle connection, a slow head, ``Connection: close``,
a large head, a stalled body; a shutdown with an idle connection open; and
OpenAI calls whose clients leave at any moment, each cancelling its request.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.http.guard import DRAIN_BYTES
from hordelite.storage import queries as q
from hordelite.storage.schema import requests
from hordelite.testing import FakeChatWorker, open_horde
from hordelite.testing._instance import TestHorde
from tests.integration._raw import HEARTBEAT, PATIENCE, assert_heartbeat, connect

pytestmark = pytest.mark.anyio


def post(path: str, length: int) -> bytes:
    """A POST's head declaring a body of ``length`` bytes."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def server(**keys: Any) -> Config:
    return Config().replace(server=keys)


# Answers before the body was read ----------------------------------------------------------


@pytest.mark.parametrize("body_after_answer", [False, True])
async def test_after_a_413_the_next_request_on_the_connection_is_answered(
    body_after_answer: bool,
) -> None:
    # The body is over max_body_bytes but within what a drain reads: the
    # rest is read and dropped, and the connection serves the next request.
    body = b"x" * 100_000
    async with open_horde(config=server(max_body_bytes=2048)) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            head = post("/api/v2/generate/text/async", len(body))
            if body_after_answer:
                # Quart refuses a declared length over the cap before
                # reading anything: the body comes after the answer.
                await conn.send(head)
                status, headers, answer = await conn.response()
                await conn.send(body)
            else:
                await conn.send(head + body)
                status, headers, answer = await conn.response()
            assert status == 413
            assert json.loads(answer)["rc"] == "PayloadTooLarge"
            assert "close" not in headers.get("connection", "")
            await assert_heartbeat(conn)


async def test_a_413_whose_body_is_too_large_to_drain_says_connection_close_and_closes() -> None:
    length = DRAIN_BYTES * 4
    async with open_horde(config=server(max_body_bytes=2048)) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(post("/api/v2/generate/text/async", length))
            status, headers, _ = await conn.response()
            assert status == 413
            assert headers["connection"] == "close"
            # The client sends the body anyway: the server reads a bounded
            # part of it, then closes instead of reading it as a request.
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                for _ in range(length // 65536):
                    await conn.send(b"x" * 65536)
            assert await conn.closed()


@pytest.mark.parametrize("body_after_answer", [False, True])
async def test_after_a_404_to_a_request_with_a_body_the_next_request_is_answered(
    body_after_answer: bool,
) -> None:
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            for _ in range(20):  # the hang the issue saw was intermittent
                body = b'{"a": 1}'
                if body_after_answer:
                    await conn.send(post("/no/such/route", len(body)))
                    status, _, _ = await conn.response()
                    await conn.send(body)
                else:
                    await conn.send(post("/no/such/route", len(body)) + body)
                    status, _, _ = await conn.response()
                assert status == 404
                await assert_heartbeat(conn)


async def test_a_body_that_stalls_gets_408_after_body_timeout_and_the_connection_closes() -> None:
    config = server(body_timeout=0.5)
    async with open_horde(config=config) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(post("/api/v2/generate/text/async", 100) + b'{"prompt"')
            started = anyio.current_time()
            status, _, body = await conn.response()
            assert status == 408, body
            assert json.loads(body)["rc"] == "RequestTimeout"
            assert 0.4 < anyio.current_time() - started < 5
            # The rest of the body never comes: the drain gives up, the
            # connection closes.
            assert await conn.closed()


# Deadlines --------------------------------------------------------------------------------


async def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_timeout() -> None:
    async with (
        open_horde(config=server(keep_alive_timeout=0.5)) as horde,
        connect(horde) as conn,
    ):
        with anyio.fail_after(PATIENCE):
            await assert_heartbeat(conn)
            await assert_heartbeat(conn)  # kept alive between requests
            answered = anyio.current_time()
            assert await conn.closed()
            assert 0.4 < anyio.current_time() - answered < 3


async def test_a_slowloris_still_sending_its_head_is_cut_after_keep_alive_timeout() -> None:
    async with (
        open_horde(config=server(keep_alive_timeout=0.5)) as horde,
        connect(horde) as conn,
    ):
        opened = anyio.current_time()
        cut = False
        with anyio.fail_after(PATIENCE):
            await conn.send(b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: t\r\n")
            try:
                # A header line every 0.1 s: the head never completes.
                for i in range(int(PATIENCE / 0.1)):
                    await conn.send(f"X-Slow-{i}: y\r\n".encode())
                    with anyio.move_on_after(0.1):
                        if await conn.closed():
                            cut = True
                            break
            except (anyio.BrokenResourceError, OSError):
                cut = True
        assert cut
        assert anyio.current_time() - opened < 3


async def test_connection_close_from_the_client_is_honoured() -> None:
    # A keep-alive timeout far longer than the test's patience: only the
    # header can close the connection in time.
    async with (
        open_horde(config=server(keep_alive_timeout=60)) as horde,
        connect(horde) as conn,
    ):
        with anyio.fail_after(PATIENCE):
            await conn.send(HEARTBEAT.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            status, headers, _ = await conn.response()
            assert status == 200
            assert headers["connection"].lower() == "close"
            assert await conn.closed()


async def test_a_head_over_max_header_bytes_gets_431_and_the_connection_closes() -> None:
    async with (
        open_horde(config=server(max_header_bytes=1024)) as horde,
        connect(horde) as conn,
    ):
        with anyio.fail_after(PATIENCE):
            # The head arrives in parts, as a slow or hostile client sends it:
            # the part held while it is incomplete is what the bound counts.
            await conn.send(HEARTBEAT.removesuffix(b"\r\n") + b"X-Big: " + b"y" * 2048)
            status, _, _ = await conn.response()
            assert status == 431
            assert await conn.closed()


async def test_shutdown_does_not_wait_for_an_idle_kept_alive_connection() -> None:
    # open_horde gives open requests 2 s of grace; an idle connection holds none.
    async with contextlib.AsyncExitStack() as outlives:
        async with open_horde(config=server(keep_alive_timeout=60)) as horde:
            # Entered on the outer stack: the connection stays open while
            # the horde stops.
            conn = await outlives.enter_async_context(connect(horde))
            await assert_heartbeat(conn)
            stopping = anyio.current_time()
        assert anyio.current_time() - stopping < 1.0
        with anyio.fail_after(PATIENCE):
            assert await conn.closed()


# Clients that leave --------------------------------------------------------------------------

MODEL = "leaving-model"


async def _leave_mid_call(horde: TestHorde, stream: bool) -> None:
    """Send an OpenAI call, then leave at a random moment."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    async with connect(horde) as conn:
        await conn.send(post("/v1/chat/completions", len(body)) + body)
        with anyio.move_on_after(random.uniform(0, 0.05)):
            await conn.response()  # an answer (a refusal) would end the call early


async def _waiting_and_total(database: str) -> tuple[int, int]:
    async with open_horde(database=database) as horde:
        stats = await horde.horde.db.read(q.model_queue_stats)

        def total(conn: Any) -> int:
            return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())

        return sum(jobs for jobs, _ in stats.values()), await horde.horde.db.read(total)


@pytest.mark.parametrize("executor", ["inline", "threads"])
async def test_every_openai_call_whose_client_left_cancels_its_request(executor: str) -> None:
    calls = 150
    config = Config().replace(storage={"executor": executor})
    with tempfile.TemporaryDirectory(prefix="hordelite-") as tmp:
        database = str(Path(tmp) / "horde.db")
        async with open_horde(config=config, database=database) as horde:
            owner = await horde.create_key("bob")
            async with FakeChatWorker(horde.url, owner, model_id=MODEL) as worker:
                await worker.pop()  # online with the model; never serves
            async with anyio.create_task_group() as tg:
                for i in range(calls):
                    tg.start_soon(_leave_mid_call, horde, i % 2 == 1)
        # The horde stopped (its open calls answered and cancelled): what is
        # still waiting was left behind by a call whose client had left.
        waiting, total = await _waiting_and_total(database)
    assert total > 0, "no call got as far as queueing its request"
    assert waiting == 0, f"{waiting} of {total} requests were left waiting"
