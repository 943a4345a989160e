"""Status reads answered from the status cache (decision 0038), and the
long-polled status read ``GET .../status/{id}?wait=N``.

A status read of a request that has not changed must not touch the database;
every change (a job handed out or given back, a generation, a cancel, an
expiry, a purge) must show at the next read. Statements are counted on the
horde's own engines as SQLAlchemy sends them.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from hordelite.contract.limits import MAX_STATUS_WAIT, STATUS_POSITION_SECONDS
from hordelite.horde import caches as service
from hordelite.testing import FakeChatWorker, FakeTextWorker, ManualClock, TestHorde
from tests.integration._env import open_env
from tests.integration._helpers import eventually, statements, submit_text

pytestmark = pytest.mark.anyio

MODEL = "fake-model"
READS = 20


def status_path(request_id: str, kind: str = "text") -> str:
    return f"/api/v2/generate/{kind}/status/{request_id}"


async def status_of(client: httpx.AsyncClient, request_id: str, **params: Any) -> dict[str, Any]:
    r = await client.get(status_path(request_id), params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def queue_text(client: httpx.AsyncClient, key: str) -> str:
    return await submit_text(client, key, "Once upon a time", models=[MODEL])


async def test_reads_of_an_unchanged_request_send_no_statement() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        async with FakeTextWorker(env.horde.url, env.owner, models=[MODEL]) as w:
            waiting = await queue_text(env.client, env.requester)
            first = await status_of(env.client, waiting)
            with statements(env.horde) as sent:
                again = [await status_of(env.client, waiting) for _ in range(READS)]
            assert sent == []
            assert again == [first] * READS

            job = await w.pop()
            assert job["id"] is not None
            processing = await status_of(env.client, waiting)
            assert (processing["processing"], processing["waiting"]) == (1, 0)
            with statements(env.horde) as sent:
                for _ in range(READS):
                    assert await status_of(env.client, waiting) == processing
                clock.advance(STATUS_POSITION_SECONDS * 10)  # not waiting: no time limit
                assert await status_of(env.client, waiting) == processing
            assert sent == []

            await w.submit(job["id"], "The end.", seed=1)
            done = await status_of(env.client, waiting)
            assert (done["done"], done["finished"]) == (True, 1)
            with statements(env.horde) as sent:
                for _ in range(READS):
                    assert await status_of(env.client, waiting) == done
            assert sent == []


async def test_a_waiting_request_is_read_again_after_the_position_window() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        request_id = await queue_text(env.client, env.requester)
        await status_of(env.client, request_id)
        with statements(env.horde) as sent:
            clock.advance(STATUS_POSITION_SECONDS / 2)
            await status_of(env.client, request_id)
            assert sent == []
            clock.advance(STATUS_POSITION_SECONDS / 2)
            await status_of(env.client, request_id)
            assert sent != []


async def test_every_change_shows_at_the_next_read() -> None:
    clock = ManualClock()
    async with open_env(clock=clock, job_ttl=30, retention=60) as env:
        async with FakeTextWorker(env.horde.url, env.owner, models=[MODEL]) as w:
            request_id = await queue_text(env.client, env.requester)
            assert (await status_of(env.client, request_id))["waiting"] == 1
            # Handed out: processing at once (no wait for the position window).
            job = await w.pop()
            assert (await status_of(env.client, request_id))["processing"] == 1
            # Its lease expires: the sweep gives it back.
            clock.advance(31)
            await env.horde.sweep()
            back = await status_of(env.client, request_id)
            assert (back["processing"], back["waiting"], back["restarted"]) == (0, 1, 1)
            # Handed out again and done.
            job = await w.pop()
            assert job["id"] is not None
            assert (await status_of(env.client, request_id))["processing"] == 1
            await w.submit(job["id"], "The end.", seed=1)
            assert (await status_of(env.client, request_id))["done"] is True
            # Purged past the retention: gone at once.
            clock.advance(61)
            await env.horde.sweep()
            r = await env.client.get(status_path(request_id))
            assert r.status_code == 404, r.text

        cancelled = await queue_text(env.client, env.requester)
        assert (await status_of(env.client, cancelled))["done"] is False
        r = await env.client.delete(status_path(cancelled))
        assert r.status_code == 200, r.text
        assert (await status_of(env.client, cancelled))["done"] is True

        expiring = await queue_text(env.client, env.requester)
        assert (await status_of(env.client, expiring))["faulted"] is False
        clock.advance(env.horde.horde.config.horde.request_expiry + 1)
        await env.horde.sweep()
        assert (await status_of(env.client, expiring))["faulted"] is True


async def test_a_long_polled_status_answers_at_the_requests_next_change() -> None:
    async with open_env() as env:
        async with FakeTextWorker(env.horde.url, env.owner, models=[MODEL]) as w:
            request_id = await queue_text(env.client, env.requester)
            answers: list[dict[str, Any]] = []

            async def long_poll() -> None:
                answers.append(await status_of(env.client, request_id, wait=MAX_STATUS_WAIT))

            with anyio.fail_after(10):  # far below the wait: the pop ends it
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_poll)
                    await wait_for_status_waiter(env.horde)
                    job = await w.pop()
            assert job["id"] is not None
            [answer] = answers
            assert (answer["processing"], answer["waiting"]) == (1, 0)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_poll)
                    await wait_for_status_waiter(env.horde)
                    await w.submit(job["id"], "The end.", seed=1)
            assert answers[1]["done"] is True

            # An ended request answers at once.
            with anyio.fail_after(5):
                assert (await status_of(env.client, request_id, wait=MAX_STATUS_WAIT))["done"]


async def test_a_long_polled_chat_status_answers_at_its_reply() -> None:
    async with open_env() as env:
        async with FakeChatWorker(env.horde.url, env.owner, model_id=MODEL) as w:
            assert (await w.pop())["id"] is None  # online, declared
            r = await env.client.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": env.requester},
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            answers: list[dict[str, Any]] = []

            async def long_poll() -> None:
                r = await env.client.get(status_path(request_id, "chat"), params={"wait": 30})
                assert r.status_code == 200, r.text
                answers.append(r.json())

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_poll)
                    await wait_for_status_waiter(env.horde)
                    assert await w.serve_one(wait=0) is not None
            # The pop or the reply, whichever it saw first; then the reply.
            if not answers[0]["done"]:
                assert answers[0]["processing"] == 1
                with anyio.fail_after(10):
                    await long_poll()
            assert answers[-1]["done"] is True
            assert answers[-1]["generations"][0]["message"]["content"]


async def test_a_long_poll_without_news_answers_after_its_wait() -> None:
    async with open_env() as env:
        request_id = await queue_text(env.client, env.requester)
        before = await status_of(env.client, request_id)
        started = anyio.current_time()
        with anyio.fail_after(10):
            after = await status_of(env.client, request_id, wait=0.3)
        assert anyio.current_time() - started >= 0.3
        assert after["waiting"] == before["waiting"] == 1
        assert env.horde.horde.signals.statistics()["status_waiters"] == 0


async def test_a_stopping_horde_answers_its_long_polled_statuses() -> None:
    answered: list[dict[str, Any]] = []
    async with open_env() as env:
        request_id = await queue_text(env.client, env.requester)

        async def long_poll() -> None:
            answered.append(await status_of(env.client, request_id, wait=MAX_STATUS_WAIT))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(long_poll)
                await wait_for_status_waiter(env.horde)
                env.horde.horde.begin_shutdown()
    assert len(answered) == 1
    assert answered[0]["waiting"] == 1


@pytest.mark.parametrize(
    ("wait", "why"),
    [
        ("soon", "expected a number of seconds"),
        ("-1", "expected 0 to"),
        ("nan", "expected 0 to"),
        ("inf", "expected 0 to"),
        (str(MAX_STATUS_WAIT + 1), "expected 0 to"),
    ],
)
async def test_a_bad_wait_is_refused_naming_it(wait: str, why: str) -> None:
    async with open_env() as env:
        request_id = await queue_text(env.client, env.requester)
        for kind in ("text", "chat"):
            r = await env.client.get(status_path(request_id, kind), params={"wait": wait})
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["rc"] == "BadRequest"
            assert why in body["errors"]["wait"]


async def wait_for_status_waiter(horde: TestHorde) -> None:
    """Until a long-polled status read is waiting (polled with a deadline)."""
    await eventually(lambda: horde.horde.signals.statistics()["status_waiters"], within=5)


# The pool snapshot: the online workers a submit and a status check against ---


def reads_workers(sent: list[str]) -> bool:
    return any("FROM workers" in s for s in sent)


async def test_a_submit_reads_the_workers_at_most_once_a_pool_window() -> None:
    clock = ManualClock()
    async with open_env(clock=clock, requester_kudos=1000) as env:
        async with FakeTextWorker(env.horde.url, env.owner, models=[MODEL]) as w:
            assert (await w.pop())["id"] is None
            await queue_text(env.client, env.requester)
            with statements(env.horde) as sent:
                for _ in range(5):
                    await queue_text(env.client, env.requester)
            assert not reads_workers(sent)


async def test_a_worker_joining_or_leaving_shows_at_once() -> None:
    clock = ManualClock()
    async with open_env(clock=clock, requester_kudos=1000) as env:
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": env.requester},
            json={"prompt": "p", "models": ["other"]},
        )
        assert r.json()["warnings"][0]["code"] == "NoAvailableWorker"
        waiting = r.json()["id"]
        assert (await status_of(env.client, waiting))["is_possible"] is False
        # Joins (no clock move): the next submit and status see it.
        async with FakeTextWorker(env.horde.url, env.owner, models=["other"], name="w-other") as w:
            # The pop takes the waiting request; the next one waits for it.
            assert (await w.pop())["payload"]["prompt"] == "p"
            r = await env.client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": env.requester},
                json={"prompt": "p", "models": ["other"]},
            )
            assert "warnings" not in r.json()
            second = r.json()["id"]
            assert (await status_of(env.client, second))["is_possible"] is True
            # Leaves, saying so: seen at once.
            wid = (await env.client.get("/api/v2/workers/name/w-other")).json()["id"]
            r = await env.client.put(
                f"/api/v2/workers/{wid}", headers={"apikey": env.owner}, json={"online": False}
            )
            assert r.status_code == 200, r.text
            r = await env.client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": env.requester},
                json={"prompt": "p", "models": ["other"]},
            )
            assert r.json()["warnings"][0]["code"] == "NoAvailableWorker"
            clock.advance(STATUS_POSITION_SECONDS)  # the second's cached position window
            assert (await status_of(env.client, second))["is_possible"] is False


async def test_the_least_recently_read_status_leaves_the_cache_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "STATUS_CACHE_ENTRIES", 2)
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        first, second, third = [await queue_text(env.client, env.requester) for _ in range(3)]
        await status_of(env.client, first)
        await status_of(env.client, second)
        with statements(env.horde) as sent:
            await status_of(env.client, first)  # cached: now the most recently read
        assert sent == []
        await status_of(env.client, third)  # a third entry: the least recently read goes
        with statements(env.horde) as sent:
            await status_of(env.client, first)
            await status_of(env.client, third)
        assert sent == []
        with statements(env.horde) as sent:
            await status_of(env.client, second)
        assert sent != []
