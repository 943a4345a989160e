"""Several hordes on one PostgreSQL schema and one Redis database act as one.

Each test opens three replicas (A, B, C): complete hordes with their own
HTTP servers, sharing the database and the Redis signals, as
``hordelite serve`` replicas behind a load balancer would. Timings are held
to deadlines far below the front's fallback re-check, so a signal that did
not cross replicas fails the test rather than slowing it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from hordelite.config import Config
from hordelite.contract.limits import REDIS_TIMEOUT_SECONDS
from hordelite.testing import FakeChatWorker, FakeTextWorker, TestHorde, open_horde
from tests.integration._env import TLS
from tests.integration._helpers import RedisServer, eventually, submit_text, text_status

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.postgres,
    # The SDK leaves its inner async generators to the collector when a
    # stream ends early; trio warns about that (the SDK's, not the front's).
    pytest.mark.filterwarnings(
        "ignore:Async generator '(openai|httpx|httpcore)\\.:ResourceWarning"
    ),
]

MODEL = "fake-model"
# Far below the front's fallback re-check of a waiting call, and below any
# pop's wait: an answer within this came through a signal.
PROMPT_ANSWER = 5.0


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.asynccontextmanager
async def replicas(database: str, redis_url: str, count: int = 3) -> AsyncIterator[list[TestHorde]]:
    config = Config().replace(signals={"url": redis_url})
    async with contextlib.AsyncExitStack() as stack:
        hordes = [
            await stack.enter_async_context(open_horde(config=config, database=database))
            for _ in range(count)
        ]
        yield hordes


@contextlib.asynccontextmanager
async def own_redis_replicas(database: str) -> AsyncIterator[tuple[RedisServer, list[TestHorde]]]:
    """Two replicas whose Redis is a server of the test's own, which the
    test can stop or kill (it is killed at the block's end in any case)."""
    redis = RedisServer()
    redis.start()
    try:
        async with replicas(database, redis.url, count=2) as hordes:
            yield redis, hordes
    finally:
        redis.kill()


async def requester_and_owner(horde: TestHorde, kudos: float = 100) -> tuple[str, str]:
    """The keys of a requester with ``kudos`` and of a workers' owner."""
    return await horde.create_key("alice", kudos=kudos), await horde.create_key("bob")


async def until_degraded(hordes: Sequence[TestHorde], degraded: bool, within: float) -> None:
    """Until every replica's signals are degraded (with ``degraded``), or
    every one's are back (without)."""
    await eventually(
        lambda: all(h.horde.signals.degraded == degraded for h in hordes), within=within
    )


def client(horde: TestHorde) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30)


@contextlib.asynccontextmanager
async def sdk_of(horde: TestHorde, key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The openai SDK on ``horde``'s front under ``key``, without retries."""
    async with (
        httpx.AsyncClient(verify=TLS, timeout=60) as http,
        openai.AsyncOpenAI(
            base_url=horde.url + "/v1", api_key=key, max_retries=0, http_client=http
        ) as sdk,
    ):
        yield sdk


async def colour_stream(sdk: openai.AsyncOpenAI) -> AsyncStream[ChatCompletionChunk]:
    """A streamed call asking for a colour."""
    return await sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=64,
        stream=True,
    )


async def post_progress(
    on: httpx.AsyncClient, owner: str, job: dict[str, Any], seq: int, content: str
) -> httpx.Response:
    """The worker's progress post of ``content`` for ``job``, under its owner's key."""
    body = {"id": job["id"], "seq": seq, "delta": {"content": content}}
    return await on.post("/api/v2/generate/text/progress", headers={"apikey": owner}, json=body)


async def queue_text(horde: TestHorde, key: str) -> str:
    async with client(horde) as c:
        return await submit_text(c, key, "Once upon a time", models=[MODEL])


async def assert_a_waiting_pop_is_woken(
    worker: FakeTextWorker, waiting_on: TestHorde, queued_on: TestHorde, key: str
) -> tuple[dict[str, Any], str]:
    """A pop long-polling on ``waiting_on`` gets the job of a text request
    queued on ``queued_on`` (once the pop waits) within PROMPT_ANSWER, far
    below the pop's wait: (the job, the request's id)."""
    jobs: list[dict[str, Any]] = []

    async def long_poll() -> None:
        jobs.append(await worker.pop(wait=30))

    with anyio.fail_after(PROMPT_ANSWER):
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_poll)
            await eventually(
                lambda: waiting_on.horde.signals.statistics()["queue_waiters"] == 1,
                within=PROMPT_ANSWER,
            )
            request_id = await queue_text(queued_on, key)
    assert jobs[0]["id"] is not None
    return jobs[0], request_id


async def test_a_long_polled_pop_on_one_replica_is_woken_by_a_submit_on_another(
    postgres_schema_url: str, redis_url: str
) -> None:
    async with replicas(postgres_schema_url, redis_url) as (a, b, _):
        key, owner = await requester_and_owner(a)
        async with FakeTextWorker(a.url, owner, models=[MODEL]) as worker:
            assert (await worker.pop())["id"] is None  # online, declared
            await assert_a_waiting_pop_is_woken(worker, a, b, key)


async def test_a_status_on_one_replica_shows_a_change_made_on_another_at_once(
    postgres_schema_url: str, redis_url: str
) -> None:
    async with replicas(postgres_schema_url, redis_url) as (a, b, c):
        key, owner = await requester_and_owner(a)
        request_id = await queue_text(a, key)
        async with client(b) as reader, FakeTextWorker(c.url, owner, models=[MODEL]) as worker:
            path = f"/api/v2/generate/text/status/{request_id}"
            assert (await reader.get(path)).json()["waiting"] == 1  # now cached on B
            job = await worker.pop()
            assert (await reader.get(path)).json()["processing"] == 1
            await worker.submit(job["id"], "The end.", seed=1)
            done = (await reader.get(path)).json()
            assert (done["done"], done["finished"]) == (True, 1)


async def test_a_reply_submitted_on_one_replica_answers_a_call_waiting_on_another(
    postgres_schema_url: str, redis_url: str
) -> None:
    async with replicas(postgres_schema_url, redis_url) as (a, b, _):
        key, owner = await requester_and_owner(a)
        async with (
            FakeChatWorker(a.url, owner, model_id=MODEL) as worker,
            sdk_of(b, key) as sdk,
        ):
            assert (await worker.pop())["id"] is None  # online, declared
            answers: list[Any] = []

            async def call() -> None:
                answers.append(
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}]
                    )
                )

            with anyio.fail_after(PROMPT_ANSWER):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    assert await worker.serve_one(wait=30) is not None
            assert answers[0].choices[0].message.content


async def test_progress_posted_to_one_replica_streams_from_another_and_a_cancel_reaches_the_worker(
    postgres_schema_url: str, redis_url: str
) -> None:
    """The worker pops on A and posts to B; the client streams from C, sees
    deltas before any submit, then closes the stream (a cancel on C): the
    worker's next post to A reports it."""
    async with replicas(postgres_schema_url, redis_url) as (a, b, c):
        key, owner = await requester_and_owner(a)
        async with (
            FakeChatWorker(a.url, owner, model_id=MODEL) as worker,
            client(b) as poster_b,
            client(a) as poster_a,
            sdk_of(c, key) as sdk,
        ):
            assert (await worker.pop())["id"] is None
            seen = anyio.Event()
            deltas: list[str] = []

            async def stream() -> None:
                response = await colour_stream(sdk)
                chunks = response.__aiter__()
                try:
                    async for chunk in chunks:
                        if chunk.choices and chunk.choices[0].delta.content:
                            deltas.append(chunk.choices[0].delta.content)
                            seen.set()
                            break  # the client goes: a cancel
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]
                    await response.close()

            with anyio.fail_after(PROMPT_ANSWER):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    job = await worker.pop(wait=30)
                    assert job["payload"]["stream_progress"] is True
                    r = await post_progress(poster_b, owner, job, 1, "Blue is a colour.")
                    assert r.status_code == 200, r.text
                    await seen.wait()
                assert "".join(deltas)
                # The cancel made through C is reported by A to the worker.
                answer: dict[str, Any] = {}

                async def cancelled() -> bool:
                    nonlocal answer
                    r = await post_progress(poster_a, owner, job, 2, " Red too.")
                    answer = r.json()
                    return r.status_code == 200 and answer.get("cancelled") is True

                await eventually(cancelled, within=PROMPT_ANSWER)

                # Settled on what was posted: the worker's owner earned kudos.
                # The lease says cancelled before the cancel's settlement
                # commits, so the kudos are looked for with a deadline.
                async def owner_earned() -> bool:
                    r = await poster_a.get("/api/v2/find_user", headers={"apikey": owner})
                    return float(r.json()["kudos"]) > 0

                await eventually(owner_earned, within=PROMPT_ANSWER)


# Losing Redis ----------------------------------------------------------------


async def test_losing_redis_degrades_every_path_and_service_recovers_when_it_returns(
    postgres_schema_url: str,
) -> None:
    async with own_redis_replicas(postgres_schema_url) as (redis, (a, b)):
        key, owner = await requester_and_owner(a)
        async with (
            FakeTextWorker(a.url, owner, models=[MODEL]) as worker,
            FakeChatWorker(a.url, owner, model_id=MODEL, name="chat-worker") as chat,
            client(a) as on_a,
            client(b) as on_b,
            sdk_of(b, key) as sdk,
        ):
            assert (await worker.pop())["id"] is None
            assert (await chat.pop())["id"] is None
            redis.kill()
            await until_degraded((a, b), True, within=PROMPT_ANSWER)

            # A text request submitted on B reaches a pop long-polling on
            # A by polling, long before the pop's wait.
            job, request_id = await assert_a_waiting_pop_is_woken(worker, a, b, key)
            path = f"/api/v2/generate/text/status/{request_id}"
            assert (await on_b.get(path)).json()["processing"] == 1
            await worker.submit(job["id"], "The end.", seed=1)
            assert (await on_b.get(path)).json()["done"] is True

            # A streamed OpenAI call on B: the worker's progress posts
            # answer 503 ChatProgressUnavailable; its submit answers the
            # call with the whole reply.
            chunks: list[str] = []

            async def stream() -> None:
                response = await colour_stream(sdk)
                async for chunk in response:
                    if chunk.choices and chunk.choices[0].delta.content:
                        chunks.append(chunk.choices[0].delta.content)

            with anyio.fail_after(PROMPT_ANSWER * 2):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    job = await chat.pop(wait=30)
                    assert job["id"] is not None
                    r = await post_progress(on_a, owner, job, 1, "Blue")
                    assert r.status_code == 503, r.text
                    assert r.json()["rc"] == "ChatProgressUnavailable"
                    reply = {
                        "message": {"role": "assistant", "content": "Blue."},
                        "finish_reason": "stop",
                    }
                    r = await chat.submit_reply(job, reply)
                    assert r.status_code == 200, r.text
            assert "".join(chunks) == "Blue."

            # Redis returns: both replicas notice, and signals cross again.
            redis.start()
            await until_degraded((a, b), False, within=15)
            await assert_a_waiting_pop_is_woken(worker, a, b, key)
            assert not a.horde.signals.degraded


async def test_a_hung_redis_costs_submits_and_statuses_milliseconds_once_degraded(
    postgres_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP: Redis keeps its connections open and answers nothing, so the
    pub/sub listener never fails; the first command on each replica finds
    it out. From then on submits and status reads skip Redis (its circuit
    is open) until the probe sees it answer; one log line says the outage
    began and one that it ended; then signals cross replicas again."""
    caplog.set_level(logging.INFO, logger="hordelite.signals")
    async with own_redis_replicas(postgres_schema_url) as (redis, (a, b)):
        key, owner = await requester_and_owner(a, kudos=1000)
        async with (
            FakeTextWorker(a.url, owner, models=[MODEL]) as worker,
            client(a) as on_a,
            client(b) as on_b,
        ):
            assert (await worker.pop())["id"] is None
            await submit_text(on_a, key, "Once upon a time", models=[MODEL])
            redis.stop()
            # The first Redis command on each replica (a submit's
            # announcement: a status read sends none) costs up to the timeout.
            with anyio.fail_after(REDIS_TIMEOUT_SECONDS * 3):
                async with anyio.create_task_group() as tg:
                    for c in (on_a, on_b):
                        tg.start_soon(functools.partial(submit_text, models=[MODEL]), c, key, "?")
            await until_degraded((a, b), True, within=REDIS_TIMEOUT_SECONDS * 3)

            took: list[float] = []
            for i in range(20):
                c = (on_a, on_b)[i % 2]
                start = time.monotonic()
                request_id = await submit_text(c, key, f"Prompt {i}", models=[MODEL])
                took.append(time.monotonic() - start)
                start = time.monotonic()
                await text_status(c, request_id)
                took.append(time.monotonic() - start)
            median = statistics.median(took)
            print(
                f"\nwhile Redis hangs: {len(took)} submits and status reads, "
                f"median {median * 1e3:.1f} ms, max {max(took) * 1e3:.1f} ms"
            )
            assert median < 0.1, took
            assert max(took) < REDIS_TIMEOUT_SECONDS / 2, took

            redis.cont()
            await until_degraded((a, b), False, within=15)
            # The pub/sub connections resumed: a pop on A is woken by a
            # submit on B (the queue holds the 23 submits above: drained first).
            while (await worker.pop())["id"] is not None:
                pass
            await assert_a_waiting_pop_is_woken(worker, a, b, key)
    lines = [r.getMessage() for r in caplog.records if r.name == "hordelite.signals"]
    outages = [m for m in lines if m.startswith("Redis signals unavailable")]
    backs = [m for m in lines if m == "Redis signals are back"]
    # One of each per replica (each process logs its own outage).
    assert (len(outages), len(backs)) == (2, 2), lines


async def test_a_killed_redis_does_not_flood_the_log_with_the_client_s_retries(
    postgres_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With Redis killed, a few seconds of submits and status reads log one
    outage line per replica and nothing per failed call: no line at INFO or
    above from any logger but the service's own, the HTTP server's and the
    test's HTTP client's."""
    caplog.set_level(logging.INFO)  # the root: as a horde logging at INFO would
    async with own_redis_replicas(postgres_schema_url) as (redis, (a, b)):
        key = await a.create_key("alice", kudos=1000)
        async with client(a) as on_a, client(b) as on_b:
            redis.kill()
            await until_degraded((a, b), True, within=PROMPT_ANSWER)
            ids = [await submit_text(c, key, "Hi", models=[MODEL]) for c in (on_a, on_b) * 5]
            calls = len(ids)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:  # status reads: each reads a version
                for c in (on_a, on_b):
                    await text_status(c, ids[calls % len(ids)])
                    calls += 1
    library = [
        r for r in caplog.records if r.name.split(".")[0] not in ("hordelite", "hypercorn", "httpx")
    ]
    outages = [r for r in caplog.records if r.getMessage().startswith("Redis signals unavailable")]
    print(f"\n{calls} calls with Redis killed: {len(library)} other log lines")
    assert calls > 20
    assert not library, [r.getMessage() for r in library[:5]]
    assert len(outages) == 2
