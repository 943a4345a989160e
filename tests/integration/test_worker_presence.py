"""When a worker counts as online: a long-poll check-in lasts about twice
the wait, a pop without wait (or one handed a job) lasts horde.worker_online,
and a worker that stops cleanly says so and leaves the pool at once."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.contract.limits import MIN_LONG_POLL_MARGIN
from hordelite.testing import TestHorde, open_fake_backend
from hordelite.worker import Worker
from tests.integration._env import TLS, open_env
from tests.integration._helpers import assert_refused, worker_registered

pytestmark = pytest.mark.anyio

MODEL = "fake-model"  # the fake backend's model id
WORKER_ONLINE = Config().horde.worker_online


async def worker_details(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await client.get(f"/api/v2/workers/name/{name}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def listed(client: httpx.AsyncClient) -> list[str]:
    r = await client.get("/api/v2/workers")
    assert r.status_code == 200, r.text
    return [w["name"] for w in r.json()]


async def chat_call(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        headers={"Authorization": "Bearer 0000000000"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}]},
    )


# A worker that stops cleanly -----------------------------------------------------


async def test_after_a_clean_stop_an_openai_call_for_its_model_is_refused_at_once_503() -> None:
    async with (
        open_env() as env,
        open_fake_backend() as fake,
    ):
        config = Config().replace(
            worker={
                "horde": env.horde.url,
                "key": env.owner,
                "name": "w1",
                "backend": fake.url,
                "wait": 5,
            }
        )
        worker = Worker(config.worker)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.serve)
            await worker_registered(env.client, "w1")
            assert "w1" in await listed(env.client)
            worker.stop()
        # serve() has returned: the worker said it stops.
        details = await worker_details(env.client, "w1")
        assert details["online"] is False
        assert "w1" not in await listed(env.client)
        # Promptly refused, not held for the front's whole budget: the model
        # is known (the worker declared it) and nobody serves it now.
        with anyio.fail_after(5):
            r = await chat_call(env.client)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "no_eligible_worker"


async def test_a_stopped_worker_is_back_online_with_its_next_pop() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w1", [MODEL])
        await worker.pop()
        worker_id = (await worker_details(env.client, "w1"))["id"]
        r = await env.client.put(
            f"/api/v2/workers/{worker_id}", headers={"apikey": env.owner}, json={"online": False}
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"online": False}
        assert (await worker_details(env.client, "w1"))["online"] is False
        await worker.pop()
        assert (await worker_details(env.client, "w1"))["online"] is True


async def test_only_the_owner_may_say_a_worker_is_offline_and_only_false_is_accepted() -> None:
    async with open_env() as env:
        other = await env.horde.create_key("eve")
        worker = await env.text_worker("w1", [MODEL])
        await worker.pop()
        worker_id = (await worker_details(env.client, "w1"))["id"]
        path = f"/api/v2/workers/{worker_id}"
        r = await env.client.put(path, headers={"apikey": other}, json={"online": False})
        assert_refused(r, 403, "WrongCredentials")
        for value in (True, "false", 0):
            r = await env.client.put(path, headers={"apikey": env.owner}, json={"online": value})
            body = assert_refused(r, 400, "BadRequest")
            assert "online" in body["message"]
        assert (await worker_details(env.client, "w1"))["online"] is True


# How long a check-in lasts -------------------------------------------------------


async def online_after(horde: TestHorde, clock: ManualClock, seconds: float) -> bool:
    clock.advance(seconds)
    async with httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30) as client:
        return bool((await worker_details(client, "w1"))["online"])


async def test_a_long_poll_that_found_nothing_lasts_until_its_end_plus_the_margin() -> None:
    # A short wait, sat through (real time; the horde's clock is moved by
    # hand): after its last attempt the check-in lasts MIN_LONG_POLL_MARGIN.
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w1", [MODEL])
        assert (await worker.pop(0.2))["id"] is None
        assert await online_after(env.horde, clock, MIN_LONG_POLL_MARGIN - 1)
        assert not await online_after(env.horde, clock, 2)


async def test_a_long_poll_in_progress_lasts_until_its_end_plus_its_wait_again() -> None:
    # A 12 s wait, not sat through: while the pop waits, its first attempt's
    # check-in lasts the wait left (about 12 s) plus the wait again.
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w1", [MODEL])
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.pop, 12.0)
            await worker_registered(env.client, "w1")
            assert await online_after(env.horde, clock, 23)
            assert not await online_after(env.horde, clock, 2)
            tg.cancel_scope.cancel()


async def test_a_pop_without_wait_lasts_worker_online_as_the_ai_horde_counts() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w1", [MODEL])
        await worker.pop()
        assert await online_after(env.horde, clock, WORKER_ONLINE - 1)
        assert not await online_after(env.horde, clock, 2)


async def test_a_long_poll_handed_a_job_lasts_worker_online_while_the_worker_generates() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w1", [MODEL])
        async with httpx.AsyncClient(base_url=env.horde.url, verify=TLS, timeout=30) as client:
            r = await client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": "0000000000"},
                json={"prompt": "Once upon a time", "models": [MODEL]},
            )
            assert r.status_code == 202, r.text
            job = await worker.pop(5)
            assert job["id"] is not None
            assert await online_after(env.horde, clock, WORKER_ONLINE - 1)
            assert not await online_after(env.horde, clock, 2)
