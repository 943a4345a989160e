"""Faulted submits as the AI Horde's own worker bridge sends them."""

from __future__ import annotations

import pytest

from hordelite.testing import FakeTextWorker
from tests.integration._env import open_env

pytestmark = pytest.mark.anyio

MAX_FAULTS = 2  # from the specification: more than this many faulted jobs end a request


def bridge_fault(job_id: str) -> dict[str, object]:
    """The body the worker bridge submits when its backend fails."""
    return {"id": job_id, "state": "faulted", "generation": "faulted", "seed": -1}


async def test_the_bridges_faulted_submit_with_seed_minus_1_is_recorded_and_ends_the_request() -> (
    None
):
    async with open_env() as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Fail me")
        for lap in range(MAX_FAULTS + 1):
            job = await worker.pop()
            assert job["id"] is not None, lap
            r = await worker.client.post("/generate/text/submit", json=bridge_fault(job["id"]))
            assert r.status_code == 200, r.text
        status = await env.text_status(request_id)
        assert status["faulted"] is True, status
        assert status["done"] is False
        assert (await worker.pop())["id"] is None  # nothing left to loop on


async def test_a_job_still_held_when_its_request_ends_faulted_is_aborted_and_charges_nobody() -> (
    None
):
    async with open_env(max_faults=0) as env:
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": env.requester},
            json={"prompt": "Two", "params": {"n": 2}, "models": ["m1"]},
        )
        request_id = r.json()["id"]
        async with (
            FakeTextWorker(env.horde.url, env.owner, name="a", models=["m1"]) as a,
            FakeTextWorker(env.horde.url, env.owner, name="b", models=["m1"]) as b,
        ):
            first, second = await a.pop(), await b.pop()
            r = await a.client.post("/generate/text/submit", json=bridge_fault(first["id"]))
            assert r.status_code == 200, r.text
            r = await b.client.post(
                "/generate/text/submit", json={"id": second["id"], "generation": "late"}
            )
            assert r.status_code == 400
            assert r.json()["rc"] == "AbortedGen"
        status = await env.text_status(request_id)
        assert (status["faulted"], status["kudos"], status["generations"]) == (True, 0.0, [])
        r = await env.client.get("/api/v2/find_user", headers={"apikey": env.requester})
        assert r.json()["kudos"] == 100
