"""Generations inside the budget (decision 0069): a generation is bounded by
its job's max_length, counts toward its requester's stored bytes until its
request is purged, and the AI Horde bridge's null generation is the fault
it reports."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hordelite.contract.generations import allowed_bytes, reserved_bytes
from hordelite.storage.schema import client_generations, jobs, users
from hordelite.testing import FakeTextWorker, ManualClock, TestHorde
from tests.integration._env import Env, open_env
from tests.integration.test_budgets import (
    ANON,
    FLOODER,
    POLITE,
    TEXT_ASYNC,
    assert_over_budget,
    budgets,
    client_from,
    text_body,
)

pytestmark = pytest.mark.anyio

SUBMIT = "/api/v2/generate/text/submit"
BOUND = allowed_bytes("text", 16)  # text_body's max_length
PROMPT = "Hello"
# What a waiting text_body(PROMPT) request holds of its user's stored bytes:
# its prompt and its generation's reservation.
HELD = len(PROMPT) + reserved_bytes("text", 16, 1)


async def generation_bytes(horde: TestHorde, name: str) -> int:
    """The user's generation_bytes as the database holds them."""

    def read(conn: Any) -> int:
        return int(
            conn.execute(
                select(users.c.generation_bytes).where(users.c.username == name)
            ).scalar_one()
        )

    return await horde.horde.db.read(read)


async def job_state(horde: TestHorde, job_id: str) -> tuple[str, str | None]:
    def read(conn: Any) -> tuple[str, str | None]:
        row = conn.execute(select(jobs.c.state, jobs.c.text).where(jobs.c.id == job_id)).one()
        return row.state, row.text

    return await horde.horde.db.read(read)


async def queue_text(env: Env, prompt: str = PROMPT) -> httpx.Response:
    """The requester's text request of ``text_body(prompt)``: the answer."""
    return await env.client.post(
        TEXT_ASYNC, headers={"apikey": env.requester}, json=text_body(prompt)
    )


async def served_one(env: Env, generation: str) -> dict[str, Any] | None:
    """A worker of the owner serves the first job it pops with ``generation``;
    its job, or None when there was none."""
    async with FakeTextWorker(
        env.horde.url, env.owner, models=["m"], generate=lambda _: generation
    ) as worker:
        return await worker.serve_one(wait=0)


async def test_a_text_generation_past_its_jobs_bound_is_refused_and_one_at_it_is_taken(
    database: str | None,
) -> None:
    async with open_env(config=budgets(), database=database) as env:
        r = await queue_text(env)
        assert r.status_code == 202, r.text
        async with FakeTextWorker(env.horde.url, env.requester, models=["m"]) as worker:
            job = await worker.pop()
            # Bytes of UTF-8, not characters: "é" is two.
            for over in ("x" * (BOUND + 1), "é" * (BOUND // 2 + 1)):
                s = await worker.client.post(
                    "/generate/text/submit", json={"id": job["id"], "generation": over}
                )
                assert s.status_code == 400, s.text
                body = s.json()
                assert body["rc"] == "BadRequest", body
                assert "generation" in body["errors"], body
                assert f"{BOUND} bytes" in body["message"]
                assert await job_state(env.horde, job["id"]) == ("processing", None)
            assert await generation_bytes(env.horde, "alice") == 0
            # At the bound (a max_length 16 job: 256 bytes and the allowance).
            at = "é" * (BOUND // 2)
            await worker.submit(job["id"], at)
            assert await job_state(env.horde, job["id"]) == ("done", at)
            await env.horde.sweep()  # the request released: its generation counts on alice
            assert await generation_bytes(env.horde, "alice") == BOUND


async def test_generations_count_toward_the_requesters_stored_bytes_until_the_purge(
    database: str | None,
) -> None:
    clock = ManualClock()
    # Room for two requests held (each its prompt and its reservation) and
    # a little more: not for a third beside the first one's generation.
    config = budgets(stored_bytes=2 * HELD + 100)
    async with open_env(config=config, clock=clock, database=database) as env:
        r = await queue_text(env)
        assert r.status_code == 202, r.text
        assert await served_one(env, "g" * 4000) is not None
        # Until the request is released, its reservation counts for its generation.
        assert await generation_bytes(env.horde, "alice") == 0
        await env.horde.sweep()  # ended, its prompt and reservation released
        assert await generation_bytes(env.horde, "alice") == 4000
        assert await generation_bytes(env.horde, "bob") == 0  # the requester's, not the worker's
        r = await queue_text(env)
        assert r.status_code == 202, r.text
        r = await queue_text(env)
        body = assert_over_budget(r, 429, "StoredBytesExceeded", "budgets.stored_bytes")
        assert f"hold {HELD + 4000} bytes" in body["message"], body
        # Past the retention the first request is purged, its generation with it.
        clock.advance(config.horde.retention + 1)
        await env.horde.sweep()
        assert await generation_bytes(env.horde, "alice") == 0


async def test_an_anonymous_addresss_generations_count_toward_its_own_stored_bytes_only(
    database: str | None,
) -> None:
    # The anonymous user's budgets are each address's (decision 0071): the
    # generations one address's requests keep until their purge fill its
    # budget, never another's (counted on the one anonymous user, they
    # locked every anonymous client out).
    clock = ManualClock()
    config = budgets(anonymous_stored_bytes=2 * HELD + 100)
    async with (
        open_env(config=config, clock=clock, database=database) as env,
        client_from(env.horde, FLOODER, apikey=ANON) as flooder,
        client_from(env.horde, POLITE, apikey=ANON) as polite,
    ):
        r = await flooder.post(TEXT_ASYNC, json=text_body(PROMPT))
        assert r.status_code == 202, r.text
        assert await served_one(env, "g" * 4000) is not None
        await env.horde.sweep()  # released: its generation now counts on its address
        assert (await flooder.post(TEXT_ASYNC, json=text_body(PROMPT))).status_code == 202
        r = await flooder.post(TEXT_ASYNC, json=text_body(PROMPT))
        body = assert_over_budget(r, 429, "StoredBytesExceeded", "budgets.anonymous_stored_bytes")
        assert f"hold {HELD + 4000} bytes" in body["message"], body
        # The other address holds nothing: two requests fit beside each other.
        for _ in range(2):
            r = await polite.post(TEXT_ASYNC, json=text_body(PROMPT))
            assert r.status_code == 202, r.text
        # Past the retention the purge takes the generation off its address,
        # and forgets the address.
        clock.advance(config.horde.retention + 1)
        await env.horde.sweep()
        assert await env.horde.horde.db.read(_client_rows) == []
        assert (await flooder.post(TEXT_ASYNC, json=text_body(PROMPT))).status_code == 202


def _client_rows(conn: Any) -> list[Any]:
    return list(conn.execute(select(client_generations)).all())


async def test_the_bridges_null_generation_is_the_fault_it_reports(
    database: str | None,
) -> None:
    # AI-Horde-Worker's scribe bridge, when its backend answered 500 to
    # every try, submits its text None with no state.
    async with open_env(config=budgets(), database=database) as env:
        r = await queue_text(env)
        request_id = r.json()["id"]
        async with FakeTextWorker(env.horde.url, env.requester, models=["m"]) as worker:
            job = await worker.pop()
            s = await worker.client.post(
                "/generate/text/submit", json={"id": job["id"], "generation": None, "seed": 0}
            )
            assert s.status_code == 200, s.text
            assert s.json() == {"reward": 0}
            assert (await job_state(env.horde, job["id"]))[0] == "faulted"
            # Back in the queue at once, not after its lease.
            again = await worker.pop()
            assert again["id"] is not None
            assert again["id"] != job["id"]
        status = (await env.client.get(f"/api/v2/generate/text/status/{request_id}")).json()
        assert status["restarted"] == 1, status
