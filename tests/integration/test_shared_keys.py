"""Shared keys (``/sharedkeys``, decision 0058): a user lends a key; requests
sent with it are the owner's, paid from the owner's kudos and the key's,
within the key's limits, until it runs out or expires. Run on SQLite and
PostgreSQL (``chat_database``)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from hordelite.clock import ManualClock
from hordelite.contract.limits import SHARED_KEYS_PER_USER
from hordelite.testing import FakeTextWorker
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, kudos_of, text_status
from tests.integration.test_images import (
    image_body,
    online_vision_worker,
    png_data_url,
)

pytestmark = pytest.mark.anyio

ANON = "0000000000"


async def lend(client: httpx.AsyncClient, owner: str, **terms: Any) -> dict[str, Any]:
    r = await client.put("/api/v2/sharedkeys", headers={"apikey": owner}, json=terms)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def text_body(**params: Any) -> dict[str, Any]:
    return {"prompt": "Hello", "params": params, "models": ["m1"]}


async def test_a_request_sent_with_a_shared_key_is_paid_by_its_owner_and_spends_the_key(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        key = await lend(
            env.client, env.requester, kudos=50, name="for friends", max_text_tokens=100
        )
        assert (key["kudos"], key["utilized"], key["name"]) == (50, 0, "for friends")
        assert key["username"].startswith("alice#")
        assert key["expiry"] is None
        r = await env.client.get(f"/api/v2/sharedkeys/{key['id']}")
        assert r.json() == key
        async with FakeTextWorker(env.horde.url, env.owner, models=["m1"]) as worker:
            r = await env.client.post(
                "/api/v2/generate/text/async", headers={"apikey": key["id"]}, json=text_body()
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            assert await worker.serve_one() is not None
        cost = (await env.text_status(request_id))["kudos"]
        assert cost > 0
        assert await env.kudos() == pytest.approx(100 - cost)
        after = (await env.client.get(f"/api/v2/sharedkeys/{key['id']}")).json()
        assert after["kudos"] == int(50 - cost)  # whole kudos, as the AI Horde shows them
        assert after["utilized"] >= cost


async def test_a_shared_keys_limits_refuse_a_request_before_anything_is_queued() -> None:
    async with open_env(requester_kudos=10_000) as env:
        capped = await lend(env.client, env.requester, max_text_tokens=64)
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": capped["id"]},
            json=text_body(max_length=128),
        )
        assert_refused(r, 400, "BadRequest")
        assert "params.max_length" in r.json()["errors"]
        poor = await lend(env.client, env.requester, kudos=1)
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": poor["id"]},
            json=text_body(max_length=512, max_context_length=4096),
        )
        assert_refused(r, 403, "SharedKeyInsufficientKudos")
        r = await env.client.patch(
            f"/api/v2/sharedkeys/{poor['id']}", headers={"apikey": env.requester}, json={"kudos": 0}
        )
        assert r.status_code == 200, r.text
        r = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": poor["id"]}, json=text_body()
        )
        assert_refused(r, 403, "SharedKeyEmpty")
        perf = (await env.client.get("/api/v2/status/performance")).json()
        assert perf["queued_text_requests"] == 0


async def test_a_shared_key_expires_and_a_deleted_one_no_longer_authenticates() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        brief = await lend(env.client, env.requester, expiry=1)
        assert brief["expiry"] is not None
        clock.advance(2 * 86400)
        r = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": brief["id"]}, json=text_body()
        )
        assert_refused(r, 403, "SharedKeyExpired")
        r = await env.client.delete(
            f"/api/v2/sharedkeys/{brief['id']}", headers={"apikey": env.requester}
        )
        assert r.json() == {"message": "OK"}
        r = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": brief["id"]}, json=text_body()
        )
        assert_refused(r, 401, "InvalidAPIKey")
        assert_refused(
            await env.client.get(f"/api/v2/sharedkeys/{brief['id']}"), 401, "InvalidAPIKey"
        )


async def test_only_its_owner_changes_a_key_and_what_the_ai_horde_refuses_is_refused() -> None:
    async with open_env() as env:
        other = await env.horde.create_key("carol", kudos=100)
        key = await lend(env.client, env.requester)
        assert key["kudos"] == 5000  # the AI Horde's default
        url = f"/api/v2/sharedkeys/{key['id']}"
        assert_refused(
            await env.client.patch(url, headers={"apikey": other}, json={"name": "mine"}),
            403,
            "WrongCredentials",
        )
        assert_refused(
            await env.client.delete(url, headers={"apikey": other}), 403, "WrongCredentials"
        )
        assert_refused(
            await env.client.patch(url, headers={"apikey": env.requester}, json={}),
            400,
            "NoSharedKeyModSelected",
        )
        assert_refused(
            await env.client.patch(url, headers={"apikey": env.requester}, json={"kudos": "lots"}),
            400,
            "BadRequest",
        )
        assert_refused(
            await env.client.put("/api/v2/sharedkeys", headers={"apikey": ANON}, json={}),
            403,
            "AnonForbidden",
        )
        assert_refused(await env.client.get("/api/v2/sharedkeys/not-a-key"), 401, "InvalidAPIKey")
        for _ in range(SHARED_KEYS_PER_USER - 1):
            await lend(env.client, env.requester)
        r = await env.client.put("/api/v2/sharedkeys", headers={"apikey": env.requester}, json={})
        assert_refused(r, 403, "Forbidden")
        # A shared key lends requests only: it runs no worker.
        r = await env.client.post(
            "/api/v2/generate/text/pop",
            headers={"apikey": key["id"]},
            json={"name": "w", "models": ["m1"]},
        )
        assert_refused(r, 401, "InvalidAPIKey")
        assert (await env.client.get(url)).json()["name"] == ""


async def test_a_shared_key_serves_as_a_bearer_key_on_the_openai_front() -> None:
    async with open_env() as env:
        key = await lend(env.client, env.requester, max_text_tokens=10)
        r = await env.client.post(
            "/v1/completions",
            headers={"Authorization": f"Bearer {key['id']}"},
            json={"model": "m1", "prompt": "Hi", "max_tokens": 20},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("params.max_length")


async def _send_at_once(
    client: httpx.AsyncClient, key: str, count: int, **params: Any
) -> list[httpx.Response]:
    """``count`` text requests through ``key``, all in flight together."""
    answers: list[httpx.Response] = []

    async def send() -> None:
        answers.append(
            await client.post(
                "/api/v2/generate/text/async", headers={"apikey": key}, json=text_body(**params)
            )
        )

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(send)
    return answers


async def test_a_shared_keys_cap_holds_under_concurrent_submits(
    chat_database: str | None,
) -> None:
    # Each request's price is reserved on the key when it is queued: of 12
    # requests sent at once, only as many as the key's kudos cover are
    # queued, and the lender pays at most the key's kudos once a worker has
    # answered them all in full.
    async with open_env(database=chat_database, requester_kudos=10_000) as env:
        params = {"max_length": 512, "max_context_length": 1024}
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": env.requester},
            json={**text_body(**params), "dry_run": True},
        )
        price = r.json()["kudos"]
        cap = 100
        assert 1 < cap // price < 12
        key = await lend(env.client, env.requester, kudos=cap)
        answers = await _send_at_once(env.client, key["id"], 12, **params)
        admitted = [a.json()["id"] for a in answers if a.status_code == 202]
        assert len(admitted) == int(cap // price)
        for refused in (a for a in answers if a.status_code != 202):
            assert_refused(refused, 403, "SharedKeyInsufficientKudos")
        before = await kudos_of(env.client, env.requester)
        async with FakeTextWorker(
            env.horde.url, env.owner, models=["m1"], generate=lambda _: "word " * 512
        ) as worker:
            for _ in admitted:
                assert await worker.serve_one() is not None
        charged = before - await kudos_of(env.client, env.requester)
        assert charged == pytest.approx(len(admitted) * price)
        assert charged <= cap
        left = (await env.client.get(f"/api/v2/sharedkeys/{key['id']}")).json()
        assert left["kudos"] == int(cap - charged)


async def test_a_request_that_ends_unsettled_releases_what_it_held_on_its_key() -> None:
    clock = ManualClock()
    async with open_env(clock=clock, request_expiry=600, requester_kudos=10_000) as env:
        params = {"max_length": 512, "max_context_length": 1024}
        key = await lend(env.client, env.requester, kudos=30)  # one such request at a time
        sent = await _send_at_once(env.client, key["id"], 1, **params)
        assert sent[0].status_code == 202, sent[0].text
        held = sent[0].json()["id"]
        again = (await _send_at_once(env.client, key["id"], 1, **params))[0]
        assert_refused(again, 403, "SharedKeyInsufficientKudos")
        assert "held by its requests in flight" in again.json()["message"]
        # Cancelled: its price is free again.
        r = await env.client.delete(f"/api/v2/generate/text/status/{held}")
        assert r.status_code == 200, r.text
        sent = await _send_at_once(env.client, key["id"], 1, **params)
        assert sent[0].status_code == 202, sent[0].text
        # Expired: the same.
        clock.advance(601)
        await env.horde.sweep()
        sent = await _send_at_once(env.client, key["id"], 1, **params)
        assert sent[0].status_code == 202, sent[0].text
        left = (await env.client.get(f"/api/v2/sharedkeys/{key['id']}")).json()
        assert (left["kudos"], left["utilized"]) == (30, 0)


async def test_each_shared_key_has_its_own_idempotency_keys() -> None:
    # A key's holder cannot claim an Idempotency-Key of its lender's (the
    # lender then got 409 for a request of its own), nor read the lender's
    # request back with one; each resubmit answers its own first request.
    async with open_env(requester_kudos=10_000) as env:
        key = await lend(env.client, env.requester)
        other = await lend(env.client, env.requester)

        async def send(api_key: str, prompt: str) -> httpx.Response:
            return await env.client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": api_key, "Idempotency-Key": "k1"},
                json={**text_body(), "prompt": prompt},
            )

        by_holder = await send(key["id"], "the holder's")
        assert by_holder.status_code == 202, by_holder.text
        by_owner = await send(env.requester, "the lender's")
        assert by_owner.status_code == 202, by_owner.text
        by_other = await send(other["id"], "another holder's")
        assert by_other.status_code == 202, by_other.text
        ids = {r.json()["id"] for r in (by_holder, by_owner, by_other)}
        assert len(ids) == 3
        assert (await send(key["id"], "the holder's")).json()["id"] == by_holder.json()["id"]
        assert (await send(env.requester, "the lender's")).json()["id"] == by_owner.json()["id"]
        assert_refused(await send(key["id"], "something else"), 409, "OperationKeyReused")
        perf = (await env.client.get("/api/v2/status/performance")).json()
        assert perf["queued_text_requests"] == 3


async def test_a_shared_key_is_served_where_its_lenders_key_is() -> None:
    # A dry run (checked as the AI Horde checks one through a key) and a
    # chat request with an image were 401 through a shared key.
    async with open_env(requester_kudos=10_000) as env:
        key = await lend(env.client, env.requester, kudos=30, max_text_tokens=512)
        dry = {**text_body(max_length=512, max_context_length=1024), "dry_run": True}
        by_owner = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": env.requester}, json=dry
        )
        by_key = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": key["id"]}, json=dry
        )
        assert by_key.status_code == by_owner.status_code == 200, by_key.text
        assert by_key.json() == by_owner.json()
        dry["params"]["max_length"] = 513
        r = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": key["id"]}, json=dry
        )
        assert_refused(r, 400, "BadRequest")
        poor = await lend(env.client, env.requester, kudos=1)
        dry["params"]["max_length"] = 512
        r = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": poor["id"]}, json=dry
        )
        assert_refused(r, 403, "SharedKeyInsufficientKudos")
        perf = (await env.client.get("/api/v2/status/performance")).json()
        assert perf["queued_text_requests"] == 0  # the dry runs queued nothing
        async with online_vision_worker(env.horde, env.owner):
            r = await env.client.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": key["id"]},
                json=image_body(png_data_url()),
            )
            assert r.status_code == 202, r.text


async def test_a_lender_lists_its_keys_and_a_shared_key_finds_its_lender() -> None:
    # As on the AI Horde: the lender sees its keys' ids (sharedkey_ids) in
    # its own details (find_user, GET /users/{id}), nobody else does; a
    # shared key's find_user answers its lender as anyone sees it.
    async with open_env() as env:
        other = await env.horde.create_key("carol", kudos=100)
        lent = {(await lend(env.client, env.requester, name=f"k{i}"))["id"] for i in range(3)}
        mine = (await env.client.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
        assert set(mine["sharedkey_ids"]) == lent
        user_url = f"/api/v2/users/{mine['id']}"
        seen = (await env.client.get(user_url, headers={"apikey": env.requester})).json()
        assert set(seen["sharedkey_ids"]) == lent
        for headers in ({"apikey": other}, {}):
            assert "sharedkey_ids" not in (await env.client.get(user_url, headers=headers)).json()
        gone = lent.pop()
        r = await env.client.delete(f"/api/v2/sharedkeys/{gone}", headers={"apikey": env.requester})
        assert r.status_code == 200, r.text
        mine = (await env.client.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
        assert set(mine["sharedkey_ids"]) == lent
        key = (await env.client.get(f"/api/v2/sharedkeys/{sorted(lent)[0]}")).json()
        found = (await env.client.get("/api/v2/find_user", headers={"apikey": key["id"]})).json()
        assert found["id"] == mine["id"]
        assert found["username"] == f"{mine['username']} (Shared Key: {key['name']})"
        assert "sharedkey_ids" not in found
        assert "worker_ids" not in found
        assert_refused(
            await env.client.get("/api/v2/find_user", headers={"apikey": gone}), 404, "UserNotFound"
        )


async def test_a_shared_key_reads_back_the_requests_sent_through_it_and_no_other() -> None:
    async with open_env() as env:
        key, other = await lend(env.client, env.requester), await lend(env.client, env.requester)
        sent = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": key["id"]}, json=text_body()
        )
        by_owner = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": env.requester}, json=text_body()
        )
        url = "/api/v2/generate/text/request/{}"
        mine = await env.client.get(url.format(sent.json()["id"]), headers={"apikey": key["id"]})
        assert mine.status_code == 200, mine.text
        assert mine.json()["prompt"] == "Hello"
        lender = await env.client.get(
            url.format(sent.json()["id"]), headers={"apikey": env.requester}
        )
        assert lender.status_code == 200, lender.text
        for request_id, api_key in (
            (sent.json()["id"], other["id"]),
            (by_owner.json()["id"], key["id"]),
        ):
            r = await env.client.get(url.format(request_id), headers={"apikey": api_key})
            assert_refused(r, 403, "WrongCredentials")


async def test_a_request_naming_no_model_holds_its_price_on_the_largest_model_online(
    chat_database: str | None,
) -> None:
    # Its quote prices an unknown model (1 billion parameters), but any
    # worker may take it: a 70B worker's job cost the key many times what it
    # held, past its kudos.
    big = "Llama-3.3-70B-Instruct"
    async with open_env(database=chat_database, requester_kudos=10_000) as env:
        cap = 500
        key = await lend(env.client, env.requester, kudos=cap)
        params = {"max_length": 64, "max_context_length": 1024}
        body = {"prompt": "Hello", "params": params}
        async with FakeTextWorker(
            env.horde.url, env.owner, models=[big], generate=lambda _: "word " * 64
        ) as worker:
            assert (await worker.pop())["id"] is None  # online
            answers: list[httpx.Response] = []

            async def send() -> None:
                answers.append(
                    await env.client.post(
                        "/api/v2/generate/text/async", headers={"apikey": key["id"]}, json=body
                    )
                )

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(send)
            admitted = [a for a in answers if a.status_code == 202]
            assert 1 <= len(admitted) < 6
            for refused in (a for a in answers if a.status_code != 202):
                assert_refused(refused, 403, "SharedKeyInsufficientKudos")
            before = await kudos_of(env.client, env.requester)
            for _ in admitted:
                assert await worker.serve_one() is not None
        charged = before - await kudos_of(env.client, env.requester)
        assert charged > len(admitted) * admitted[0].json()["kudos"]  # the 70B price
        assert charged <= cap


async def test_a_cancelled_requests_job_still_out_holds_its_price_until_it_settles(
    chat_database: str | None,
) -> None:
    # A cancel leaves a worker's job out: it settles, and charges, when it
    # comes in, so its price stays held on the key until then.
    async with open_env(database=chat_database, requester_kudos=10_000) as env:
        params = {"max_length": 512, "max_context_length": 1024}
        key = await lend(env.client, env.requester, kudos=30)  # one such request at a time
        async with FakeTextWorker(
            env.horde.url, env.owner, models=["m1"], generate=lambda _: "short"
        ) as worker:
            [sent] = await _send_at_once(env.client, key["id"], 1, **params)
            assert sent.status_code == 202, sent.text
            job = await worker.pop()
            assert job["id"] is not None
            r = await env.client.delete(f"/api/v2/generate/text/status/{sent.json()['id']}")
            assert r.status_code == 200, r.text
            [held] = await _send_at_once(env.client, key["id"], 1, **params)
            assert_refused(held, 403, "SharedKeyInsufficientKudos")
            await worker.submit(job["id"], "short")
            [freed] = await _send_at_once(env.client, key["id"], 1, **params)
            assert freed.status_code == 202, freed.text
        left = (await env.client.get(f"/api/v2/sharedkeys/{key['id']}")).json()
        assert 0 < left["utilized"] < 25


async def test_a_faulted_request_releases_what_it_held_on_its_key() -> None:
    async with open_env(max_faults=0, requester_kudos=10_000) as env:
        params = {"max_length": 512, "max_context_length": 1024}
        key = await lend(env.client, env.requester, kudos=30)  # one such request at a time
        async with FakeTextWorker(env.horde.url, env.owner, models=["m1"]) as worker:
            [sent] = await _send_at_once(env.client, key["id"], 1, **params)
            assert sent.status_code == 202, sent.text
            job = await worker.pop()
            assert job["id"] is not None
            [held] = await _send_at_once(env.client, key["id"], 1, **params)
            assert_refused(held, 403, "SharedKeyInsufficientKudos")
            await worker.submit(job["id"], "", state="faulted")
            assert (await text_status(env.client, sent.json()["id"]))["faulted"] is True
            [freed] = await _send_at_once(env.client, key["id"], 1, **params)
            assert freed.status_code == 202, freed.text
        left = (await env.client.get(f"/api/v2/sharedkeys/{key['id']}")).json()
        assert (left["kudos"], left["utilized"]) == (30, 0)
