"""Faulted submits as the AI Horde's own worker bridge sends them."""

from __future__ import annotations

import httpx
import pytest

from hordelite.testing import FakeTextWorker, open_horde
from tests.integration._helpers import submit_text, text_status

pytestmark = pytest.mark.anyio

MAX_FAULTS = 2  # from the specification: more than this many faulted jobs end a request


def bridge_fault(job_id: str) -> dict[str, object]:
    """The body the worker bridge submits when its backend fails."""
    return {"id": job_id, "state": "faulted", "generation": "faulted", "seed": -1}


async def test_the_bridges_faulted_submit_with_seed_minus_1_is_recorded_and_ends_the_request() -> (
    None
):
    async with open_horde() as horde:
        requester = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            request_id = await submit_text(client, requester, "Fail me", models=["m1"])
            for lap in range(MAX_FAULTS + 1):
                job = await worker.pop()
                assert job["id"] is not None, lap
                r = await worker.client.post("/generate/text/submit", json=bridge_fault(job["id"]))
                assert r.status_code == 200, r.text
            status = await text_status(client, request_id)
            assert status["faulted"] is True, status
            assert status["done"] is False
            assert (await worker.pop())["id"] is None  # nothing left to loop on
