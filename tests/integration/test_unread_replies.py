"""No reply nobody can read (issue 20, decision 0051): an OpenAI call is its
request's only reader, so a request whose call is gone without its answer is
cancelled and charges its requester nothing, whoever hands in the reply and
whenever. What a worker streamed before the cancel is still settled on the
posted text (the specification's rule), and the client gets all of it.

The process holding the call dying is covered here by the lease lapsing
(a reader that stopped renewing) and, with a real process killed with
SIGKILL and restarted in its place, in test_unread_after_a_kill.py.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.contract.chat_request import parse_chat_request
from hordelite.contract.limits import READER_LEASE_SECONDS
from hordelite.horde.requests import Submitter
from hordelite.storage.schema import requests
from hordelite.testing import FakeChatWorker
from tests.integration._chat_helpers import MODEL, STRICT, open_chat_horde, pop_nothing
from tests.integration._env import TLS
from tests.integration._helpers import eventually
from tests.integration.test_front import CHAT, Front, text_reply, user

# On SQLite and PostgreSQL (the chat helpers' hordes use the fixture's database).
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

BLUE = text_reply("Blue.")


@contextlib.asynccontextmanager
async def open_front(config: Config | None = None, **horde: Any) -> AsyncIterator[Front]:
    async with open_chat_horde(config=config, **horde) as env:
        yield Front(env)


async def request_row(front: Front, request_id: str) -> dict[str, Any]:
    """What storage holds of a request: its state, its charge, its reader."""

    def read(conn: Any) -> dict[str, Any]:
        row = conn.execute(requests.select().where(requests.c.id == request_id)).mappings().one()
        return {k: row[k] for k in ("state", "kudos", "reader", "unread")}

    return await front.env.horde.horde.db.read(read)


async def only_request(front: Front) -> str:
    """The id of the one request the horde holds (a call's, which the client
    never saw when it left before the answer)."""

    def read(conn: Any) -> list[str]:
        return list(conn.execute(requests.select().with_only_columns(requests.c.id)).scalars())

    ids = await front.env.horde.horde.db.read(read)
    assert len(ids) == 1, ids
    return ids[0]


async def popped(worker: FakeChatWorker) -> dict[str, Any]:
    """The next job, long-polled for."""
    job = await worker.pop(wait=10)
    assert job["id"] is not None, job
    return job


async def answer_into(
    answered: dict[str, httpx.Response], front: Front, name: str, content: str
) -> None:
    """A plain call asking ``content``; its response is kept under ``name``."""
    answered[name] = await front.http.post(
        CHAT,
        headers=front.bearer,
        json={"model": MODEL, "messages": [user(content)]},
        timeout=30,
    )


async def call_popped(
    tg: anyio.abc.TaskGroup,
    answered: dict[str, httpx.Response],
    front: Front,
    worker: FakeChatWorker,
    name: str,
    content: str,
) -> dict[str, Any]:
    """A plain call asking ``content`` (``answer_into``), started in ``tg``:
    its job, once ``worker`` pops it."""
    tg.start_soon(answer_into, answered, front, name, content)
    return await popped(worker)


@contextlib.asynccontextmanager
async def draining_front(
    grace_period: float, signals_url: str = ""
) -> AsyncIterator[tuple[Front, FakeChatWorker]]:
    """A front whose process drains for ``grace_period`` s once told to
    stop, its signals in-process or at ``signals_url``, and its online chat
    worker w1."""
    config = Config().replace(signals={"url": signals_url})
    async with open_front(config, grace_period=grace_period) as front:
        yield front, await front.worker("w1")


async def leave_after_pop(front: Front, worker: FakeChatWorker, body: dict[str, Any]) -> Any:
    """A call whose client leaves once ``worker`` holds its job; the job."""
    async with httpx.AsyncClient(base_url=front.url, verify=TLS) as leaving:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await leaving.post(CHAT, headers=front.bearer, json=body)

            tg.start_soon(call)
            job = await popped(worker)
            tg.cancel_scope.cancel()  # the client goes away while the worker generates
    request_id = await only_request(front)

    async def cancelled() -> bool:
        return (await request_row(front, request_id))["state"] == "cancelled"

    await eventually(cancelled)
    return job, request_id


# A call that ends without its answer ---------------------------------------------


async def test_a_call_left_while_a_worker_generates_charges_nothing_and_pays_the_worker() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        kudos, earned = await front.env.kudos(), await front.env.kudos(front.env.owner)
        body = {"model": MODEL, "messages": [user("Name one colour.")]}
        job, request_id = await leave_after_pop(front, worker, body)
        assert (await request_row(front, request_id))["unread"] is True

        # The worker, not told (its job does not stream), hands in the reply.
        answer = await worker.submit_reply(job, BLUE)
        assert answer.status_code == 200, answer.text
        reward = answer.json()["reward"]
        assert reward > 0  # the volunteer is paid for the work turned in
        assert await front.env.kudos() == kudos  # nobody could read it: no charge
        assert await front.env.kudos(front.env.owner) == pytest.approx(earned + reward)
        row = await request_row(front, request_id)
        assert (row["state"], row["kudos"]) == ("cancelled", 0.0)
        # Nor can anyone read it later by the request's id: it is not kept.
        status = await front.env.status(request_id)
        assert (status["done"], status["generations"]) == (True, []), status


async def test_a_requesters_own_worker_earns_nothing_for_a_call_the_requester_left() -> None:
    async with open_front() as front:
        # The requester's own worker: paying it for an unread reply would mint
        # kudos out of calls left on purpose.
        worker = await front.env.stack.enter_async_context(
            FakeChatWorker(
                front.url, front.env.requester, name="own", model_id=MODEL, chat_features=STRICT
            )
        )
        await pop_nothing(worker)
        kudos = await front.env.kudos()
        body = {"model": MODEL, "messages": [user("Name one colour.")]}
        job, _ = await leave_after_pop(front, worker, body)
        answer = await worker.submit_reply(job, BLUE)
        assert answer.status_code == 200, answer.text
        assert answer.json()["reward"] == 0
        assert await front.env.kudos() == kudos


async def test_a_native_cancel_still_charges_a_reply_handed_in_after_it() -> None:
    # The native API's requester can read a cancelled request's status: the
    # specification's rule holds there (a job that does not stream is
    # rewarded, and charged, for its reply).
    async with open_front() as front:
        worker = await front.worker("w1")
        kudos = await front.env.kudos()
        request_id = await front.env.queue(
            {"model": MODEL, "messages": [user("Name one colour.")], "max_tokens": 64}
        )
        job = await popped(worker)
        cancel = await front.http.delete(f"/api/v2/generate/chat/status/{request_id}")
        assert cancel.status_code == 200, cancel.text
        answer = await worker.submit_reply(job, BLUE)
        assert answer.status_code == 200, answer.text
        assert await front.env.kudos() < kudos
        assert (await request_row(front, request_id))["unread"] is False


# The process holding the call is gone ------------------------------------------


async def test_the_requests_of_a_reader_whose_lease_lapsed_are_cancelled_uncharged() -> None:
    clock = ManualClock()
    async with open_front(clock=clock) as front:
        horde = front.env.horde.horde
        worker = await front.worker("w1")
        kudos = await front.env.kudos()
        # A call held by another process, which then died: its request was
        # queued under that process's reader, whose lease is never renewed.
        gone = "gone-host:7001/0"
        await horde.store.hold_reader(reader=gone, expires=clock.now() + READER_LEASE_SECONDS)
        req = parse_chat_request({"model": MODEL, "messages": [user("Name one colour.")]})
        sent = Submitter(front.env.requester, "test", reader=gone)
        queued = await horde.requests.queue_chat(sent, req)
        job = await popped(worker)

        # A call of this process waits meanwhile; its lease is as old, but
        # this process serves it: the sweep leaves it be.
        answered: dict[str, httpx.Response] = {}
        async with anyio.create_task_group() as tg:
            live_job = await call_popped(tg, answered, front, worker, "live", "Name a fruit.")
            clock.advance(READER_LEASE_SECONDS + 1)
            await front.env.horde.sweep()
            row = await request_row(front, queued.id)
            assert (row["state"], row["unread"]) == ("cancelled", True)
            answer = await worker.submit_reply(job, BLUE)
            assert answer.status_code == 200, answer.text
            assert await front.env.kudos() == kudos  # the gone call's reply: no charge

            answer = await worker.submit_reply(live_job, text_reply("Apple."))
            assert answer.status_code == 200, answer.text
        assert answered["live"].status_code == 200, answered["live"].text
        assert answered["live"].json()["choices"][0]["message"]["content"] == "Apple."
        assert await front.env.kudos() < kudos  # the live call's reply was read: charged


# A draining process ---------------------------------------------------------------


async def test_a_draining_call_whose_worker_never_submits_is_handed_back_uncharged_by_the_deadline() -> (
    None
):
    async with draining_front(3) as (front, worker):
        kudos = await front.env.kudos()
        answered: dict[str, httpx.Response] = {}
        async with anyio.create_task_group() as tg:
            job = await call_popped(tg, answered, front, worker, "out", "Name one colour.")
            front.env.horde.horde.begin_shutdown()
            stopping = anyio.current_time()
        # Held while its worker had the job, up to the drain's deadline (the
        # grace period less DRAIN_ANSWER_MARGIN), then handed back.
        assert anyio.current_time() - stopping < 3
        assert answered["out"].status_code == 503, answered["out"].text
        assert answered["out"].json()["error"]["code"] == "ShuttingDown"
        answer = await worker.submit_reply(job, BLUE)  # as after a restart
        assert answer.status_code == 200, answer.text
        assert await front.env.kudos() == kudos


def _redis_url() -> str:
    return os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.mark.parametrize("signals", ["in-process", "redis"])
async def test_a_draining_process_finishes_a_call_whose_worker_has_the_job(signals: str) -> None:
    # The worker's submit reaches this process, which serves on while its
    # calls wait (server.open_server), or, with Redis signals, another
    # process: a call whose job is out waits for its reply, and a call
    # still queued is handed back at once.
    # A drain long enough for the worker's submit on a loaded machine.
    async with draining_front(30, _redis_url() if signals == "redis" else "") as (front, worker):
        kudos = await front.env.kudos()
        answered: dict[str, httpx.Response] = {}
        async with anyio.create_task_group() as tg:
            job = await call_popped(tg, answered, front, worker, "out", "Name one colour.")
            tg.start_soon(answer_into, answered, front, "queued", "Name a fruit.")

            async def two_queued() -> bool:
                return len(await _ids(front)) == 2

            await eventually(two_queued)
            front.env.horde.horde.begin_shutdown()
            await eventually(lambda: "queued" in answered)
            assert "out" not in answered  # still waiting for its worker
            answer = await worker.submit_reply(job, BLUE)
            assert answer.status_code == 200, answer.text
        assert answered["queued"].status_code == 503, answered["queued"].text
        assert answered["queued"].json()["error"]["code"] == "ShuttingDown"
        assert answered["out"].status_code == 200, answered["out"].text
        assert answered["out"].json()["choices"][0]["message"]["content"] == "Blue."
        assert await front.env.kudos() < kudos  # the finished call was read: charged once


async def _ids(front: Front) -> list[str]:
    def read(conn: Any) -> list[str]:
        return list(conn.execute(requests.select().with_only_columns(requests.c.id)).scalars())

    return await front.env.horde.horde.db.read(read)


async def test_a_stream_ended_by_the_drain_delivers_all_the_posted_text_first() -> None:
    # The cancel settles the streamed job on all its worker posted: the
    # client must get all of it before the error, though pacing held it.
    config = Config().replace(signals={"url": ""}, front={"pace_progress": True})
    posted = "Blue is the colour of the sky on a clear day, and of the sea."
    async with open_front(config) as front:
        worker = await front.worker("w1")
        deltas: list[str] = []
        events: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                body = {"model": MODEL, "messages": [user("Name one colour.")], "stream": True}
                async with front.http.stream(
                    "POST",
                    CHAT,
                    headers=front.bearer,
                    json=body,
                    timeout=30,
                ) as response:
                    async for line in response.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        event = json.loads(line[len("data: ") :])
                        events.append(event)
                        for choice in event.get("choices", []):
                            text = choice["delta"].get("content")
                            if text:
                                deltas.append(text)
                                # Shut down at the first slice: the rest is paced.
                                front.env.horde.horde.begin_shutdown()

            tg.start_soon(stream)
            job = await popped(worker)
            progress = {"id": job["id"], "seq": 1, "delta": {"content": posted}}
            r = await worker.client.post("/generate/text/progress", json=progress)
            assert r.status_code == 200, r.text
        assert "".join(deltas) == posted
        assert events[-1]["error"]["code"] == "ShuttingDown", events[-1]
