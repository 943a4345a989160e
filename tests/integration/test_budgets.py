"""Per-user budgets, black-box: what one account may queue and hold stored
([budgets], contract/budgets.py, decision 0049).

Each budget is driven over HTTP against a real horde and a real SQLite file:
going over answers 429 with Retry-After (or 413 for one request too large
on its own) with an rc and a message naming the limit, and nothing is stored
or charged. The anonymous user is one account: its budgets are shared.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from sqlalchemy import Text, cast, func, select

from hordelite.config import Config
from hordelite.contract.generations import reserved_bytes
from hordelite.storage.schema import budget_refusals, requests
from hordelite.testing import ManualClock, TestHorde, open_horde
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused
from tests.integration.test_images import (
    MODEL,
    blob_files,
    client_for,
    image_body,
    online_vision_worker,
    png_data_url,
)

pytestmark = pytest.mark.anyio

ANON = "0000000000"
TEXT_ASYNC = "/api/v2/generate/text/async"
CHAT_ASYNC = "/api/v2/generate/chat/async"
MIB = 1024 * 1024


def budgets(**values: int) -> Config:
    """The default configuration with these [budgets] keys (and in-process
    signals unless the suite runs on Redis)."""
    return Config().replace(
        budgets=values, signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")}
    )


def text_body(prompt: str = "Hello") -> dict[str, Any]:
    return {"prompt": prompt, "params": {"max_length": 16}, "models": ["m"]}


async def queued_text(http: httpx.AsyncClient, key: str, times: int) -> None:
    """``times`` text requests of ``key``, each accepted."""
    for _ in range(times):
        r = await http.post(TEXT_ASYNC, headers={"apikey": key}, json=text_body())
        assert r.status_code == 202, r.text


# What text_body's request reserves of the stored bytes for its generation.
RESERVED = reserved_bytes("text", 16, 1)


async def stored(horde: TestHorde) -> tuple[int, int, int]:
    """Rows of requests, and the characters of prompts and conversations
    they keep, as the database holds them."""

    def read(conn: Any) -> tuple[int, int, int]:
        rows, prompts, chats = conn.execute(
            select(
                func.count(),
                func.coalesce(func.sum(func.length(requests.c.prompt)), 0),
                func.coalesce(func.sum(func.length(cast(requests.c.chat, Text))), 0),
            )
        ).one()
        return int(rows), int(prompts), int(chats)

    return await horde.horde.db.read(read)


def assert_over_budget(r: httpx.Response, status: int, rc: str, limit: str) -> dict[str, Any]:
    """The refusal of a budget: names the ``limit`` (and, at 429, when to retry)."""
    body = assert_refused(r, status, rc, limit)
    assert body["limit"] == limit
    if status == 429:
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    return body


# Images -----------------------------------------------------------------------------


async def test_a_300_image_anonymous_request_is_refused_before_any_image_is_stored() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner) as worker:
            image = png_data_url(64, 64, "RGB")
            body = image_body(image)
            parts = body["messages"][0]["content"]
            body["messages"][0]["content"] = [parts[0]] + [parts[1]] * 300
            r = await http.post(CHAT_ASYNC, headers={"apikey": ANON}, json=body)
            refusal = assert_over_budget(
                r, 413, "TooManyImages", "budgets.anonymous_images_per_request"
            )
            assert "300 images" in refusal["message"]
            assert blob_files(env.horde) == []
            assert (await stored(env.horde))[0] == 0
            assert (await worker.pop())["id"] is None  # nothing queued


async def test_a_registered_user_may_send_as_many_images_as_its_own_budget() -> None:
    config = budgets(images_per_request=2, anonymous_images_per_request=1)
    async with (
        open_env(config=config) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            body = image_body(png_data_url())
            parts = body["messages"][0]["content"]
            body["messages"][0]["content"] = [parts[0], parts[1], parts[1]]
            r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
            assert r.status_code == 202, r.text
            assert len(blob_files(env.horde)) == 2
            r = await http.post(CHAT_ASYNC, headers={"apikey": ANON}, json=body)
            assert_over_budget(r, 413, "TooManyImages", "budgets.anonymous_images_per_request")


async def test_images_over_the_image_bytes_budget_are_refused_and_deleted() -> None:
    # A 1500x1500 image is stored as a JPEG of tens of kilobytes: over a
    # budget of 1 KiB on its own (413), and the blob taken in is deleted.
    async with (
        open_env(config=budgets(image_bytes=1024)) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            body = image_body(png_data_url(1500, 1500, "RGB"))
            r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
            assert_over_budget(r, 413, "RequestTooLarge", "budgets.image_bytes")
            assert blob_files(env.horde) == []
            assert (await stored(env.horde))[0] == 0


async def test_image_bytes_held_by_waiting_requests_count_until_they_end() -> None:
    async with (
        open_env(config=budgets(image_bytes=1024 * 1024)) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            body = image_body(png_data_url(1500, 1500, "RGB"))
            accepted = []
            while True:
                r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
                if r.status_code != 202:
                    break
                accepted.append(r.json()["id"])
                assert len(accepted) < 200, "the image bytes budget never refused"
            assert_over_budget(r, 429, "StoredBytesExceeded", "budgets.image_bytes")
            assert len(blob_files(env.horde)) == len(accepted)  # the refused one's went
            cancelled = await http.delete(f"/api/v2/generate/chat/status/{accepted[0]}")
            assert cancelled.status_code == 200, cancelled.text
            r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
            assert r.status_code == 202, r.text


async def test_a_cancel_deletes_the_request_images_at_once() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(png_data_url())
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            assert len(blob_files(env.horde)) == 1
            cancelled = await http.delete(f"/api/v2/generate/chat/status/{request_id}")
            assert cancelled.status_code == 200, cancelled.text
            assert blob_files(env.horde) == []
            assert (await stored(env.horde))[1:] == (0, 0)  # its conversation released too


async def test_a_done_request_releases_its_conversation_and_images_at_the_next_sweep() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner) as worker:
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(png_data_url())
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            job = await worker.pop()
            reply = {"message": {"role": "assistant", "content": "Red."}, "finish_reason": "stop"}
            assert (await worker.submit_reply(job, reply)).status_code == 200
            assert len(blob_files(env.horde)) == 1  # until the sweep
            await env.horde.sweep()
            assert blob_files(env.horde) == []
            assert (await stored(env.horde))[1:] == (0, 0)
            status = await http.get(f"/api/v2/generate/chat/status/{request_id}")
            assert status.status_code == 200, status.text
            assert status.json()["done"] is True
            assert status.json()["generations"][0]["message"]["content"] == "Red."


# Requests per minute and held -------------------------------------------------------


async def test_a_submit_and_cancel_loop_is_held_to_the_rate_and_stores_nothing_past_it(
    database: str | None,
) -> None:
    clock = ManualClock()
    config = budgets(anonymous_requests_per_minute=10)
    async with (
        open_horde(config=config, clock=clock, database=database) as horde,
        client_for(horde) as http,
    ):
        prompt = "x" * MIB
        answers = []
        for _ in range(30):
            r = await http.post(TEXT_ASYNC, headers={"apikey": ANON}, json=text_body(prompt))
            answers.append(r)
            if r.status_code == 202:
                cancel = await http.delete(f"/api/v2/generate/text/status/{r.json()['id']}")
                assert cancel.status_code == 200, cancel.text
            clock.advance(1.0)
        accepted = [r for r in answers if r.status_code == 202]
        assert len(accepted) == 10
        for refused in answers[10:]:
            body = assert_over_budget(
                refused, 429, "RequestRateExceeded", "budgets.anonymous_requests_per_minute"
            )
            assert "10" in body["message"]
        # The first answer past the window's ten: the oldest leaves it 60 s
        # after it was queued, 50 s from then.
        assert int(answers[10].headers["Retry-After"]) == 50
        rows, prompts, _ = await stored(horde)
        assert (rows, prompts) == (10, 0)  # cancelled: kept small, content released
        clock.advance(60.0)
        r = await http.post(TEXT_ASYNC, headers={"apikey": ANON}, json=text_body())
        assert r.status_code == 202, r.text


async def test_one_address_shares_the_anonymous_rate_and_a_registered_user_has_its_own() -> None:
    config = budgets(anonymous_requests_per_minute=2, requests_per_minute=3)
    async with (
        open_env(config=config, requester_kudos=0) as env,
        client_for(env.horde) as http,
    ):
        await queued_text(http, ANON, 2)
        r = await http.post(TEXT_ASYNC, headers={"apikey": ANON}, json=text_body())
        assert_over_budget(r, 429, "RequestRateExceeded", "budgets.anonymous_requests_per_minute")
        await queued_text(http, env.requester, 3)
        r = await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
        assert_over_budget(r, 429, "RequestRateExceeded", "budgets.requests_per_minute")


async def test_a_trusted_user_has_its_budget_and_an_admin_none() -> None:
    config = budgets(requests_per_minute=1, trusted_requests_per_minute=2)
    async with open_horde(config=config) as horde, client_for(horde) as http:
        trusted = await horde.create_key("carol", trusted=True)
        admin = await horde.create_key("root", admin=True)
        await queued_text(http, trusted, 2)
        r = await http.post(TEXT_ASYNC, headers={"apikey": trusted}, json=text_body())
        assert_over_budget(r, 429, "RequestRateExceeded", "budgets.trusted_requests_per_minute")
        await queued_text(http, admin, 5)


async def test_a_budget_of_0_is_no_limit() -> None:
    config = budgets(requests_per_minute=0, requests_held=0, stored_bytes=0)
    async with (
        open_env(config=config, requester_kudos=0) as env,
        client_for(env.horde) as http,
    ):
        await queued_text(http, env.requester, 25)


async def test_a_cancelled_request_holds_its_place_while_its_job_is_out(
    database: str | None,
) -> None:
    config = budgets(requests_held=1)
    async with (
        open_env(config=config, database=database) as env,
        client_for(env.horde) as http,
    ):
        worker = await env.text_worker(models=["m"])
        r = await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
        assert r.status_code == 202, r.text
        job = await worker.pop()
        assert job["id"] is not None
        cancel = await http.delete(f"/api/v2/generate/text/status/{r.json()['id']}")
        assert cancel.status_code == 200, cancel.text
        r = await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
        assert_over_budget(r, 429, "TooManyPrompts", "budgets.requests_held")
        await worker.submit(job["id"], "late reply", seed=1)
        await env.horde.sweep()  # its job is back: released
        r = await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
        assert r.status_code == 202, r.text


# Stored bytes -----------------------------------------------------------------------


async def test_a_prompt_over_the_stored_bytes_budget_alone_is_413_and_beside_others_429(
    database: str | None,
) -> None:
    # Each request also reserves the bound of its generation (decision 0069).
    limit = 1000 + RESERVED
    async with (
        open_env(config=budgets(stored_bytes=limit), database=database) as env,
        client_for(env.horde) as http,
    ):
        before = (await http.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
        r = await http.post(
            TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body("x" * 2000)
        )
        assert_over_budget(r, 413, "RequestTooLarge", "budgets.stored_bytes")
        r = await http.post(
            TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body("é" * 300)
        )
        assert r.status_code == 202, r.text  # 600 bytes of UTF-8, and the reservation
        r = await http.post(
            TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body("é" * 300)
        )
        assert_over_budget(r, 429, "StoredBytesExceeded", "budgets.stored_bytes")
        assert (await stored(env.horde))[0] == 1
        after = (await http.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
        assert after["kudos"] == before["kudos"]


@pytest.mark.parametrize("route", ["native", "front"])
async def test_a_chat_request_over_a_budget_gets_its_429(route: str) -> None:
    # A text request fills the minute's budget of one; a chat request for a
    # served model then passes admission and is refused where it is stored.
    config = budgets(requests_per_minute=1)
    async with (
        open_env(config=config) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner) as worker:
            first = await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
            assert first.status_code == 202, first.text
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            if route == "native":
                r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
                assert_over_budget(r, 429, "RequestRateExceeded", "budgets.requests_per_minute")
            else:
                r = await http.post(
                    "/v1/chat/completions",
                    headers={"authorization": f"Bearer {env.requester}"},
                    json=body,
                )
                assert r.status_code == 429, r.text
                error = r.json()["error"]
                assert error["code"] == "RequestRateExceeded"
                assert error["type"] == "rate_limit_error"
                assert "budgets.requests_per_minute" in error["message"]
                assert 1 <= int(r.headers["Retry-After"]) <= 60
            assert (await worker.pop())["id"] is None  # no chat request queued


# Anonymous budgets per client address (decision 0071) -------------------------------

# Two clients on this machine: Linux answers every 127.0.0.0/8 address on the
# loopback, so each connects from an address of its own.
FLOODER, POLITE = "127.0.0.2", "127.0.0.3"


def client_from(horde: TestHorde, address: str, **headers: str) -> httpx.AsyncClient:
    """A client of ``horde`` whose connections come from ``address``."""
    return httpx.AsyncClient(
        base_url=horde.url,
        timeout=30,
        headers=headers,
        transport=httpx.AsyncHTTPTransport(local_address=address),
    )


async def test_one_anonymous_flooder_leaves_another_anonymous_client_accepted(
    database: str | None,
) -> None:
    config = budgets(anonymous_requests_per_minute=5, anonymous_requests_held=3)
    async with (
        open_horde(config=config, database=database) as horde,
        client_from(horde, FLOODER, apikey=ANON) as flooder,
        client_from(horde, POLITE, apikey=ANON) as polite,
    ):
        answers = [(await flooder.post(TEXT_ASYNC, json=text_body())) for _ in range(8)]
        assert [r.status_code for r in answers] == [202] * 3 + [429] * 5
        # Its held budget, then its rate (which its refusals count toward).
        assert_over_budget(answers[3], 429, "TooManyPrompts", "budgets.anonymous_requests_held")
        assert_over_budget(
            answers[5], 429, "RequestRateExceeded", "budgets.anonymous_requests_per_minute"
        )
        for _ in range(3):
            r = await polite.post(TEXT_ASYNC, json=text_body())
            assert r.status_code == 202, r.text
        r = await polite.post(TEXT_ASYNC, json=text_body())
        assert_over_budget(r, 429, "TooManyPrompts", "budgets.anonymous_requests_held")


async def test_anonymous_clients_behind_a_trusted_proxy_are_counted_by_the_forwarded_address() -> (
    None
):
    config = budgets(anonymous_requests_per_minute=2).replace(
        server={"trusted_proxies": "127.0.0.2"}
    )
    async with (
        open_horde(config=config) as horde,
        client_from(horde, "127.0.0.2", apikey=ANON) as proxy,
        client_from(horde, POLITE, apikey=ANON) as direct,
    ):

        async def send(http: httpx.AsyncClient, forwarded_for: str) -> int:
            headers = {"X-Forwarded-For": forwarded_for}
            return (await http.post(TEXT_ASYNC, json=text_body(), headers=headers)).status_code

        # The proxy's clients: what each sent itself, left of the proxy's hop, is ignored.
        assert [await send(proxy, f"10.9.9.{i}, 198.51.100.1") for i in range(3)] == [202, 202, 429]
        assert [await send(proxy, "198.51.100.2") for _ in range(3)] == [202, 202, 429]
        # IPv6: one /64 is one client, whichever of its addresses it sends from.
        v6 = ["2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:2:3::9"]
        assert [await send(proxy, a) for a in v6] == [202, 202, 429]
        assert await send(proxy, "2001:db8:1:3::1") == 202
        # A client that is no trusted proxy cannot choose its address.
        assert [await send(direct, f"203.0.113.{i}") for i in range(3)] == [202, 202, 429]


async def test_budget_refusals_count_toward_the_rate(database: str | None) -> None:
    clock = ManualClock()
    config = budgets(requests_per_minute=6, requests_held=2)
    async with (
        open_env(config=config, clock=clock, database=database, requester_kudos=0) as env,
        client_for(env.horde) as http,
    ):
        answers = []
        for _ in range(10):
            answers.append(
                await http.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body())
            )
            clock.advance(1.0)
        assert [r.status_code for r in answers] == [202] * 2 + [429] * 8
        for refused in answers[2:6]:
            assert_over_budget(refused, 429, "TooManyPrompts", "budgets.requests_held")
        # Two queued and four refused fill the window of six: from here on the
        # rate's one read refuses, and the refusal counts toward nothing.
        for refused in answers[6:]:
            assert_over_budget(refused, 429, "RequestRateExceeded", "budgets.requests_per_minute")
        assert int(answers[6].headers["Retry-After"]) == 54  # the first left 60 s after it came

        def counted(conn: Any) -> int:
            return int(conn.execute(select(func.count()).select_from(budget_refusals)).scalar())

        assert await env.horde.horde.db.read(counted) == 4
        # The window moves on: the sweep forgets what it no longer counts.
        clock.advance(61.0)
        await env.horde.sweep()
        assert await env.horde.horde.db.read(counted) == 0


async def test_the_front_counts_anonymous_calls_per_address() -> None:
    config = budgets(anonymous_requests_per_minute=1).replace(
        front={"no_worker_grace": 0.2, "recheck_interval": 0.1}
    )
    async with (
        open_horde(config=config) as horde,
        client_from(horde, FLOODER, apikey=ANON) as flooder,
        client_from(horde, POLITE) as polite,
    ):
        r = await flooder.post(TEXT_ASYNC, json=text_body())
        assert r.status_code == 202, r.text
        call = {"model": "m", "prompt": "Hello", "max_tokens": 16}
        refused = await flooder.post("/v1/completions", json=call)
        assert refused.status_code == 429, refused.text
        assert "budgets.anonymous_requests_per_minute" in refused.json()["error"]["message"]
        # The other address is within its budgets: its call is queued, and
        # ends only because no worker serves "m".
        answered = await polite.post("/v1/completions", json=call)
        assert answered.status_code == 503, answered.text
        assert answered.json()["error"]["code"] == "no_eligible_worker"


async def test_a_request_with_images_past_the_rate_is_refused_before_its_images_are_read() -> None:
    config = budgets(anonymous_requests_per_minute=1)
    async with (
        open_env(config=config) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            r = await http.post(TEXT_ASYNC, headers={"apikey": ANON}, json=text_body())
            assert r.status_code == 202, r.text
            # An image no decoder takes: read, it would be refused 400; past
            # the rate, nothing of it is read.
            body = image_body("data:image/png;base64," + "A" * 4096)
            r = await http.post(CHAT_ASYNC, headers={"apikey": ANON}, json=body)
            assert_over_budget(
                r, 429, "RequestRateExceeded", "budgets.anonymous_requests_per_minute"
            )
            assert blob_files(env.horde) == []


async def test_the_anonymous_concurrency_is_each_address_own() -> None:
    config = budgets().replace(horde={"anonymous_concurrency": 2})
    async with (
        open_horde(config=config) as horde,
        client_from(horde, FLOODER, apikey=ANON) as flooder,
        client_from(horde, POLITE, apikey=ANON) as polite,
    ):
        for _ in range(2):
            r = await flooder.post(TEXT_ASYNC, json=text_body())
            assert r.status_code == 202, r.text
        r = await flooder.post(TEXT_ASYNC, json=text_body())
        assert r.status_code == 429, r.text
        assert r.json()["rc"] == "TooManyPrompts"
        assert r.json()["message"].startswith("This address has 2 generations in flight")
        r = await polite.post(TEXT_ASYNC, json=text_body())
        assert r.status_code == 202, r.text
