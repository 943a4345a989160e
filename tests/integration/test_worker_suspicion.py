"""Worker suspicion over real HTTP, on SQLite and PostgreSQL: a worker
reporting jobs at an implausible speed is paused at the AI Horde's
threshold (audited, by the horde), shows its suspicion in its details, and
an admin's reset_suspicion lifts it (audited, by the admin); a bad name
adds suspicion once; a trusted owner's workers are never suspected."""

from __future__ import annotations

import pytest

from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.suspicion import THRESHOLD
from hordelite.testing import ManualClock
from tests.integration._chat_helpers import chat_body, open_chat_horde
from tests.integration._env import Env, open_env
from tests.integration._helpers import assert_refused, worker_id

pytestmark = pytest.mark.anyio

SLOW = 60.0  # seconds from pop to submit: 20 tokens at a third of a token a second


async def serve(env: Env, worker_name: str, clock: ManualClock, seconds: float) -> None:
    """One request queued, popped by the worker, and submitted ``seconds``
    after its pop (as the horde's clock measures it)."""
    request_id = await env.submit_text("Once upon")
    popped = await _pop(env, worker_name)
    clock.advance(seconds)
    await _submit(env, worker_name, popped)
    assert (await env.text_status(request_id))["done"] is True


async def _pop(env: Env, name: str) -> str:
    body = {"name": name, "models": [env.model], "max_length": 512, "max_context_length": 2048}
    response = await env.client.post(
        "/api/v2/generate/text/pop", headers={"apikey": env.owner}, json=body
    )
    assert response.status_code == 200, response.text
    job = response.json()["id"]
    assert job is not None, response.json()
    return str(job)


async def _submit(env: Env, name: str, job_id: str) -> None:
    response = await env.client.post(
        "/api/v2/generate/text/submit",
        headers={"apikey": env.owner},
        json={"id": job_id, "generation": "and they lived happily ever after", "state": "ok"},
    )
    assert response.status_code == 200, response.text


async def test_a_worker_reporting_an_implausible_speed_is_paused_and_an_admins_reset_lifts_it(
    chat_database: str | None,
) -> None:
    clock = ManualClock()
    async with open_env(database=chat_database, clock=clock, suspect_speed=True) as env:
        admin = await env.horde.create_key("root", admin=True)
        # A plausible job adds nothing.
        await serve(env, "w", clock, SLOW)
        assert (await env.worker_details("w"))["suspicious"] == 0
        # Each job done at once (20 tokens in 0.001 s) adds one.
        for n in range(1, THRESHOLD):
            await serve(env, "w", clock, 0)
            details = await env.worker_details("w")
            assert (details["suspicious"], details["paused"]) == (n, False)
        await serve(env, "w", clock, 0)
        details = await env.worker_details("w")
        assert (details["suspicious"], details["paused"]) == (THRESHOLD, True)
        trail = await env.horde.horde.store.read_audit(
            query=AuditQuery(actions=("worker.suspicion",))
        )
        wid = await worker_id(env.client, "w")
        assert [(e.actor, e.target, e.detail["suspicion"]) for e in trail] == [
            ("horde", wid, THRESHOLD)
        ]

        # Paused: it checks in and is handed nothing.
        waiting = await env.submit_text("still there?")
        body = {"name": "w", "models": [env.model], "max_length": 512, "max_context_length": 2048}
        pop = await env.client.post(
            "/api/v2/generate/text/pop", headers={"apikey": env.owner}, json=body
        )
        assert pop.json()["id"] is None

        # Only an admin resets it; the reset lifts the pause.
        path = f"/api/v2/workers/{wid}"
        refused = await env.client.put(
            path, headers={"apikey": env.owner}, json={"reset_suspicion": True}
        )
        assert_refused(refused, 403, "NotModerator", "reset_suspicion")
        reset = await env.client.put(
            path, headers={"apikey": admin}, json={"reset_suspicion": True}
        )
        assert reset.status_code == 200, reset.text
        assert reset.json() == {"paused": False, "new_suspicion": 0}
        details = await env.worker_details("w")
        assert (details["suspicious"], details["paused"]) == (0, False)
        resets = await env.horde.horde.store.read_audit(
            query=AuditQuery(actions=("worker.suspicion_reset",))
        )
        root = (await env.client.get("/api/v2/find_user", headers={"apikey": admin})).json()
        assert [(e.actor, e.actor_id, e.target, e.detail["suspicion"]) for e in resets] == [
            (f"root#{root['id']}", root["id"], wid, THRESHOLD)
        ]
        job = await _pop(env, "w")
        clock.advance(SLOW)
        await _submit(env, "w", job)
        assert (await env.text_status(waiting))["done"] is True

        # A reset that also pauses keeps the worker paused.
        both = await env.client.put(
            path, headers={"apikey": admin}, json={"reset_suspicion": True, "paused": True}
        )
        assert both.json() == {"paused": True, "new_suspicion": 0}


async def test_a_trusted_owners_worker_is_never_suspected(chat_database: str | None) -> None:
    clock = ManualClock()
    async with open_env(database=chat_database, clock=clock, suspect_speed=True) as env:
        trusted = await env.horde.create_key("carol", trusted=True)
        env.owner = trusted
        for _ in range(THRESHOLD):
            await serve(env, "fast", clock, 0)
        details = await env.worker_details("fast")
        assert (details["suspicious"], details["paused"]) == (0, False)


async def test_a_bad_worker_name_adds_suspicion_once_per_reason(
    chat_database: str | None,
) -> None:
    config = Config().replace(moderation={"suspicious_name_words": "Rude, crude"})
    async with open_env(database=chat_database, config=config) as env:
        long_rude = "a-RUDE-worker-" + "x" * 200  # past 200 characters: long and extreme
        for name, expected in (("polite", 0), ("so-rude", 1), ("y" * 101, 1), (long_rude, 3)):
            worker = await env.text_worker(name)
            await worker.pop()
            await worker.pop()  # popping again adds nothing
            assert (await env.worker_details(name))["suspicious"] == expected, name


async def test_a_chat_worker_replying_at_an_implausible_speed_is_paused(
    chat_database: str | None,
) -> None:
    clock = ManualClock()  # the clock stands still: each reply takes no time
    async with open_chat_horde(database=chat_database, clock=clock, suspect_speed=True) as chat:
        worker = await chat.chat_worker("chatty")
        for _ in range(THRESHOLD):
            request_id = await chat.queue(chat_body())
            assert await worker.serve_one() is not None
            assert (await chat.status(request_id))["done"] is True
        details = await chat.worker_details("chatty")
        assert (details["suspicious"], details["paused"]) == (THRESHOLD, True)
