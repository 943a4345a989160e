"""The AI Horde's moderation review routes over real HTTP, on SQLite and
PostgreSQL (docs/reference/native_api.md), each for admins only (403
NotModerator for anyone else) and refusing a bad query naming the field:

* GET /operations/moderation/prompts lists the requests the prompt filters
  refused or flagged (the audit trail's entries), newest first, paged by
  ``before_id``; the prompt is never kept nor shown;
* POST /operations/moderation/prompts/{id}/notes adds a moderator's note,
  shown on the event and audited ``prompt.note``;
* GET /operations/moderation/worker_suspicion_events lists the workers the
  horde paused for suspicion; GET /operations/moderation the paused workers.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.suspicion import THRESHOLD, Suspicion
from hordelite.testing import ManualClock
from tests.integration._env import Env, open_env
from tests.integration._helpers import assert_refused
from tests.integration.test_worker_suspicion import serve

pytestmark = pytest.mark.anyio

V2 = "/api/v2"
PROMPTS = f"{V2}/operations/moderation/prompts"
OVERVIEW = f"{V2}/operations/moderation"
SUSPICION = f"{V2}/operations/moderation/worker_suspicion_events"


async def _user_id(client: httpx.AsyncClient, key: str) -> int:
    return int((await client.get(f"{V2}/find_user", headers={"apikey": key})).json()["id"])


async def _filter(env: Env, admin: str, regex: str, action: str) -> int:
    body = {"regex": regex, "filter_type": 10, "action": action}
    made = await env.client.put(f"{V2}/filters", headers={"apikey": admin}, json=body)
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


async def _get(env: Env, path: str, key: str, **params: Any) -> dict[str, Any]:
    response = await env.client.get(path, headers={"apikey": key}, params=params)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_prompt_events_show_refused_and_flagged_requests_without_their_prompts(
    chat_database: str | None,
) -> None:
    # One client sends a refused prompt and then more: offences that time
    # nothing out (tests/integration/test_addresses.py has the timeout).
    config = Config().replace(moderation={"offence_timeout": 0})
    async with open_env(database=chat_database, config=config) as env:
        admin = await env.horde.create_key("mod", admin=True)
        alice = await _user_id(env.client, env.requester)
        refuse = await _filter(env, admin, "forbidden[0-9]+", "refuse")
        flag = await _filter(env, admin, "flagme", "flag")
        body = {"prompt": "say forbidden42 now", "models": [env.model]}
        refused = await env.client.post(
            f"{V2}/generate/text/async", headers={"apikey": env.requester}, json=body
        )
        assert_refused(refused, 400, "CorruptPrompt")
        await env.submit_text("please flagme")

        page = await _get(env, PROMPTS, admin)
        events = page["events"]
        assert [(e["outcome"], e["filters"]) for e in events] == [
            ("censored", [flag]),
            ("rejected", [refuse]),
        ]
        for event in events:
            assert event["user_id"] == alice
            assert event["ipaddr"] == "127.0.0.1"  # the test client's
            assert event["reason"] == "filter_rejection"
            assert (event["text_state"], event["text_redacted"]) == ("none", True)
            assert event["submitted_prompt"] is None
            assert event["effective_prompt"] is None
            assert event["notes"] == []
            assert event["hold_source"] is None
        assert page["next_cursor"] is None
        assert page["retention"]["ceiling_days"] == 90
        raw = (await env.client.get(PROMPTS, headers={"apikey": admin})).text
        assert "forbidden42" not in raw
        assert "flagme" not in raw

        # Paged by before_id, newest first; filtered by event and user.
        first = await _get(env, PROMPTS, admin, limit=1)
        assert [e["id"] for e in first["events"]] == [events[0]["id"]]
        assert first["next_cursor"] == events[0]["id"]
        rest = await _get(env, PROMPTS, admin, limit=1, before_id=first["next_cursor"])
        assert [e["id"] for e in rest["events"]] == [events[1]["id"]]
        one = await _get(env, PROMPTS, admin, event_id=events[1]["id"])
        assert [e["id"] for e in one["events"]] == [events[1]["id"]]
        assert (await _get(env, PROMPTS, admin, user_id=alice + 100))["events"] == []
        assert (await _get(env, PROMPTS, admin, reason="worker_csam"))["events"] == []
        assert (await _get(env, PROMPTS, admin, ipaddr="203.0.113.9"))["events"] == []
        assert len((await _get(env, PROMPTS, admin, ipaddr="127.0.0.1"))["events"]) == 2
        assert len((await _get(env, PROMPTS, admin, reason="filter_rejection"))["events"]) == 2


async def test_an_admins_note_on_a_prompt_event_is_shown_and_audited(
    chat_database: str | None,
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("mod", admin=True)
        admin_id = await _user_id(env.client, admin)
        await _filter(env, admin, "forbidden", "refuse")
        body = {"prompt": "forbidden", "models": [env.model]}
        await env.client.post(
            f"{V2}/generate/text/async", headers={"apikey": env.requester}, json=body
        )
        event_id = (await _get(env, PROMPTS, admin))["events"][0]["id"]
        notes = f"{PROMPTS}/{event_id}/notes"

        made = await env.client.post(notes, headers={"apikey": admin}, json={"note": "seen it"})
        assert made.status_code == 201, made.text
        note = made.json()
        assert (note["author_id"], note["note"]) == (admin_id, "seen it")
        event = (await _get(env, PROMPTS, admin))["events"][0]
        assert event["notes"] == [note]
        assert event["hold_source"] == "note"
        trail = await env.horde.horde.store.read_audit(query=AuditQuery(actions=("prompt.note",)))
        assert [(e.actor_id, e.target, e.detail) for e in trail] == [
            (admin_id, f"event:{event_id}", {"note_id": note["id"], "chars": 7})
        ]

        # Refused: anyone but an admin, no such event, a bad note; none stored.
        as_alice = await env.client.post(
            notes, headers={"apikey": env.requester}, json={"note": "x"}
        )
        assert_refused(as_alice, 403, "NotModerator")
        missing = await env.client.post(
            f"{PROMPTS}/{event_id + 1000}/notes", headers={"apikey": admin}, json={"note": "x"}
        )
        assert_refused(missing, 404, "PromptEventNotFound")
        for bad in ({}, {"note": ""}, {"note": "x" * 2001}, {"note": "a\x00b"}):
            refused = await env.client.post(notes, headers={"apikey": admin}, json=bad)
            assert_refused(refused, 400, "BadRequest", "note", case=bad)
        bad_id = await env.client.post(
            f"{PROMPTS}/abc/notes", headers={"apikey": admin}, json={"note": "x"}
        )
        assert_refused(bad_id, 400, "BadRequest", "event_id")
        assert (await _get(env, PROMPTS, admin))["events"][0]["notes"] == [note]


async def test_a_worker_paused_for_suspicion_is_in_the_events_and_the_overview(
    chat_database: str | None,
) -> None:
    clock = ManualClock()
    async with open_env(database=chat_database, clock=clock, suspect_speed=True) as env:
        admin = await env.horde.create_key("root", admin=True)
        bob = await _user_id(env.client, env.owner)
        assert (await _get(env, SUSPICION, admin))["events"] == []
        for _ in range(THRESHOLD):
            await serve(env, "w", clock, 0)
        worker = await env.worker_details("w")

        events = (await _get(env, SUSPICION, admin))["events"]
        assert [
            (e["worker_id"], e["worker_name"], e["user_id"], e["suspicion_id"], e["reason"])
            for e in events
        ] == [(worker["id"], "w", bob, Suspicion.UNREASONABLY_FAST.value, "UNREASONABLY_FAST")]
        assert (await _get(env, SUSPICION, admin, worker_id=worker["id"]))["events"] == events
        assert (await _get(env, SUSPICION, admin, user_id=bob + 100))["events"] == []

        overview = await _get(env, OVERVIEW, admin)
        assert overview["worker_suspicion_threshold"] == THRESHOLD
        assert overview["paused_workers_total"] == 1
        [paused] = overview["paused_workers"]
        assert (paused["id"], paused["owner_id"], paused["suspicious"]) == (
            worker["id"],
            bob,
            THRESHOLD,
        )
        assert [(r["id"], r["count"]) for r in paused["suspicion_reasons"]] == [
            (Suspicion.UNREASONABLY_FAST.value, THRESHOLD)
        ]
        assert (await _get(env, OVERVIEW, admin, worker_type="image"))["paused_workers"] == []
        by_name = await _get(env, OVERVIEW, admin, suspicion_id=Suspicion.WORKER_NAME_LONG.value)
        assert by_name["paused_workers_total"] == 0


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        (OVERVIEW, "limit", "501"),
        (OVERVIEW, "sort", "kudos"),
        (OVERVIEW, "worker_type", "robot"),
        (OVERVIEW, "suspicion_id", "99"),
        (OVERVIEW, "online", "maybe"),
        (PROMPTS, "limit", "101"),
        (PROMPTS, "before_id", "x"),
        (PROMPTS, "reason", "rude"),
        (PROMPTS, "since", "yesterday"),
        (PROMPTS, "ipaddr", "not-an-address"),
        (SUSPICION, "limit", "0"),
        (SUSPICION, "user_id", "-1"),
    ],
)
async def test_the_review_routes_refuse_anyone_but_an_admin_and_a_bad_query_by_its_name(
    chat_database: str | None, path: str, field: str, value: str
) -> None:
    async with open_env(database=chat_database) as env:
        admin = await env.horde.create_key("root", admin=True)
        as_user = await env.client.get(path, headers={"apikey": env.requester})
        assert_refused(as_user, 403, "NotModerator")
        bad = await env.client.get(path, headers={"apikey": admin}, params={field: value})
        assert_refused(bad, 400, "BadRequest", field)
