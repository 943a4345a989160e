"""The whole text cycle over real HTTP: submit, pop, submit, status."""

from __future__ import annotations

import httpx
import pytest

from hordelite.testing import FakeTextWorker, open_horde

pytestmark = pytest.mark.anyio


async def test_a_text_request_is_popped_generated_and_done() -> None:
    async with open_horde() as horde:
        requester = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["fake-model"]) as worker,
        ):
            r = await client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": requester},
                json={
                    "prompt": "Once upon",
                    "params": {"max_length": 40},
                    "models": ["fake-model"],
                },
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            job = await worker.serve_one(wait=5)
            assert job is not None
            assert job["payload"]["prompt"] == "Once upon"
            status = (await client.get(f"/api/v2/generate/text/status/{request_id}")).json()
            assert status["done"] is True
            assert status["finished"] == 1
            assert status["generations"][0]["text"] == "echo: Once upon"
            assert status["generations"][0]["worker_name"] == "fake-worker"
