"""Prompt filters over real HTTP (docs/reference/filters.md): an admin's
filter refuses a matching text prompt, chat message (also one context_fit
would have dropped) and OpenAI call with nothing stored or charged, and the
refusal recorded; flag and replace rules; the /filters routes; a second
process on the same PostgreSQL database sees a new filter within seconds.
Each runs on SQLite and PostgreSQL (the ``chat_database`` fixture)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import openai
import pytest
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.limits import FILTERS_CHECK_SECONDS
from hordelite.storage import audit
from hordelite.storage.schema import requests
from hordelite.testing import open_horde
from tests.integration._chat_helpers import ChatEnv, chat_body, open_chat_horde
from tests.integration._env import client_for

pytestmark = pytest.mark.anyio

FILTERS = "/api/v2/filters"
TEXT_ASYNC = "/api/v2/generate/text/async"

NO_OFFENCE_TIMEOUTS = Config().replace(moderation={"offence_timeout": 0})


async def _admin(env: ChatEnv) -> str:
    return await env.horde.create_key("mod", admin=True)


async def _add(client: httpx.AsyncClient, key: str, regex: str, **fields: Any) -> dict[str, Any]:
    body = {"regex": regex, "filter_type": 10, **fields}
    response = await client.put(FILTERS, headers={"apikey": key}, json=body)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def _request_rows(env: ChatEnv) -> int:
    def count(conn: Any) -> int:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())

    return await env.horde.horde.db.read(count)


async def _trail(env: ChatEnv, action: str) -> list[audit.AuditEntry]:
    return await env.horde.horde.store.read_audit(query=AuditQuery(actions=(action,)))


def _corrupt(response: httpx.Response, hidden: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["rc"] == "CorruptPrompt"
    assert hidden not in body["message"].lower()


async def test_a_filter_refuses_text_chat_and_openai_calls_storing_and_charging_nothing(
    chat_database: str | None,
) -> None:
    # Several refusals from one address: offences that time nothing out
    # (each would otherwise time the address out, tests/integration/test_addresses.py).
    async with open_chat_horde(config=NO_OFFENCE_TIMEOUTS) as env:
        await env.chat_worker("w", limits={"max_context_length": 1024, "max_length": 64})
        mod = await _admin(env)
        made = await _add(env.client, mod, "forbidden", description="a test rule")
        assert made["id"] == "1"
        assert made["action"] == "refuse"
        assert made["user"] == "mod#3"
        kudos = await env.kudos()
        headers = {"apikey": env.requester}

        # A text prompt hiding the word behind spacing, dots and capitals.
        text = {"prompt": "tell me F.o.r b i d d e n things", "models": [env.model]}
        _corrupt(await env.client.post(TEXT_ASYNC, headers=headers, json=text), "forbidden")
        # A dry run answers what the request would get (a zero-width space now).
        dry = {**text, "prompt": "for\u200bbidden", "dry_run": True}
        _corrupt(await env.client.post(TEXT_ASYNC, headers=headers, json=dry), "forbidden")
        # A chat message that truncate_oldest would drop: screened all the same.
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Forbídden " + "a" * 1500},
            {"role": "assistant", "content": "b" * 1500},
            {"role": "user", "content": "And by train?"},
        ]
        chat = chat_body(messages=messages, horde={"context_fit": "truncate_oldest"})
        _corrupt(await env.submit(chat), "forbidden")
        # The OpenAI front, through the official client: both routes.
        client = openai.AsyncOpenAI(
            base_url=env.horde.url + "/v1", api_key=env.requester, max_retries=0
        )
        async with client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model=env.model, messages=[{"role": "user", "content": "forbidden!"}]
                )
            assert refused.value.code == "CorruptPrompt"
            with pytest.raises(openai.BadRequestError) as refused:
                await client.completions.create(model=env.model, prompt="so: FORBIDDEN")
            assert refused.value.code == "CorruptPrompt"

        assert await env.kudos() == kudos
        assert await _request_rows(env) == 0
        entries = await _trail(env, "request.refused")
        assert len(entries) == 5
        assert {e.actor for e in entries} == {"alice#1"}
        assert {e.target for e in entries} == {"filter:1"}
        assert all("forbid" not in str(e.detail).lower() for e in entries)

        # A request no rule matches is served.
        assert (await env.submit(chat_body("Name one colour."))).status_code == 202
        assert await _request_rows(env) == 1


async def test_flag_serves_and_records_and_replace_rewrites_what_the_worker_gets(
    chat_database: str | None,
) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        mod = await _admin(env)
        flag = await _add(env.client, mod, "dragon", action="flag")
        await _add(env.client, mod, "kitten", action="replace", replacement="cat")

        request_id = await env.queue(chat_body("Draw a Dragon with the k i t t e n, please."))
        job = await worker.pop()
        assert job["payload"]["messages"] == [
            {"role": "user", "content": "draw a dragon with the cat please"}
        ]
        [entry] = await _trail(env, "request.flagged")
        assert entry.actor == "alice#1"
        assert entry.target == f"filter:{flag['id']}"
        assert request_id

        # Unhidden, the replacement keeps the text as it was sent.
        await env.queue(chat_body("One Kitten, please."))
        job = await worker.pop()
        assert job["payload"]["messages"] == [{"role": "user", "content": "One cat, please."}]


async def test_the_filter_routes_answer_as_the_ai_horde_does(chat_database: str | None) -> None:
    async with open_chat_horde() as env:
        mod = await _admin(env)
        headers = {"apikey": mod}
        first = await _add(env.client, mod, "alpha", description="first")
        second = await _add(env.client, mod, "beta", filter_type=20)
        # The same regex and type again: the filter there is, 200.
        again = await env.client.put(
            FILTERS, headers=headers, json={"regex": "alpha", "filter_type": 10}
        )
        assert again.status_code == 200
        assert again.json() == first

        listed = await env.client.get(FILTERS, headers=headers, params={"filter_type": 20})
        assert listed.json() == [second]
        listed = await env.client.get(FILTERS, headers=headers, params={"contains": "firs"})
        assert listed.json() == [first]
        regex = await env.client.get(f"{FILTERS}/regex", headers=headers)
        assert regex.json() == [
            {"filter_type": 10, "regex": "alpha"},
            {"filter_type": 20, "regex": "beta"},
        ]

        tested = await env.client.post(FILTERS, headers=headers, json={"prompt": "Alpha, b.e.t.a!"})
        assert tested.status_code == 200
        assert tested.json() == {"suspicion": 2, "matches": ["alpha", "beta"]}
        tested = await env.client.post(
            FILTERS, headers=headers, json={"prompt": "alpha beta", "filter_type": 20}
        )
        assert tested.json() == {"suspicion": 1, "matches": ["beta"]}

        patched = await env.client.patch(
            f"{FILTERS}/{first['id']}", headers=headers, json={"regex": "gamma"}
        )
        assert patched.status_code == 200
        assert patched.json()["regex"] == "gamma"
        one = await env.client.get(f"{FILTERS}/{first['id']}", headers=headers)
        assert one.json() == patched.json()
        nothing = await env.client.patch(f"{FILTERS}/{first['id']}", headers=headers, json={})
        assert nothing.status_code == 400
        assert nothing.json()["rc"] == "NoFilterModSelected"
        gone = await env.client.delete(f"{FILTERS}/{first['id']}", headers=headers)
        assert gone.json() == {"message": "OK"}
        missing = await env.client.get(f"{FILTERS}/{first['id']}", headers=headers)
        assert missing.status_code == 404
        assert missing.json()["rc"] == "FilterNotFound"

        trail = await env.horde.horde.store.read_audit(
            query=AuditQuery(actions=("filter.create", "filter.edit", "filter.delete"))
        )
        assert [(e.action, e.target, e.actor) for e in trail] == [
            ("filter.delete", f"filter:{first['id']}", "mod#3"),
            ("filter.edit", f"filter:{first['id']}", "mod#3"),
            ("filter.create", f"filter:{second['id']}", "mod#3"),
            ("filter.create", f"filter:{first['id']}", "mod#3"),
        ]
        assert trail[1].detail == {"regex": "gamma"}
        assert all(e.address for e in trail)


async def test_only_an_admin_manages_filters_and_a_rule_re2_refuses_is_not_written(
    chat_database: str | None,
) -> None:
    async with open_chat_horde() as env:
        mod = await _admin(env)
        body = {"regex": "x", "filter_type": 10}
        for method, path in [
            ("GET", FILTERS),
            ("PUT", FILTERS),
            ("POST", FILTERS),
            ("GET", f"{FILTERS}/regex"),
            ("GET", f"{FILTERS}/1"),
            ("PATCH", f"{FILTERS}/1"),
            ("DELETE", f"{FILTERS}/1"),
        ]:
            json = (
                {"prompt": "x"}
                if method == "POST"
                else body
                if method in ("PUT", "PATCH")
                else None
            )
            response = await env.client.request(
                method, path, headers={"apikey": env.requester}, json=json
            )
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["rc"] == "NotModerator"
        for regex in [r"(a)\1", "(?=a)b", "(?<!a)b", "a*", "a" * 1001]:
            response = await env.client.put(
                FILTERS, headers={"apikey": mod}, json={"regex": regex, "filter_type": 10}
            )
            assert response.status_code == 400, regex
            assert response.json()["rc"] == "BadRequest"
            assert "regex" in response.json()["errors"]
        response = await env.client.put(
            FILTERS, headers={"apikey": mod}, json={"regex": "x", "filter_type": 30}
        )
        assert "filter_type" in response.json()["errors"]
        response = await env.client.put(
            FILTERS, headers={"apikey": mod}, json={"regex": "x", "filter_type": 10, "action": "x"}
        )
        assert "action" in response.json()["errors"]
        listed = await env.client.get(FILTERS, headers={"apikey": mod})
        assert listed.json() == []


async def test_another_process_on_the_same_database_applies_a_new_filter_within_seconds(
    migrated_schema_url: str,
) -> None:
    async with (
        open_horde(database=migrated_schema_url) as first,
        open_horde(database=migrated_schema_url) as second,
    ):
        mod = await first.create_key("mod", admin=True)
        user = await first.create_key("carol", kudos=100)
        dry = {"prompt": "a secret word", "models": ["m1"], "dry_run": True}
        async with client_for(first) as one, client_for(second) as other:
            ok = await other.post(TEXT_ASYNC, headers={"apikey": user}, json=dry)
            assert ok.status_code == 200, ok.text  # the second process has read the (no) filters
            await _add(one, mod, "secret")
            with anyio.fail_after(FILTERS_CHECK_SECONDS + 10):
                while True:
                    seen = await other.post(TEXT_ASYNC, headers={"apikey": user}, json=dry)
                    if seen.status_code == 400:
                        break
                    assert seen.status_code == 200, seen.text
                    await anyio.sleep(0.05)
            assert seen.json()["rc"] == "CorruptPrompt"
