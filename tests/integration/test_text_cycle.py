"""The whole text cycle over real HTTP: submit, pop, submit, status, with the
horde's storage on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.integration._env import open_env

pytestmark = pytest.mark.anyio


async def test_a_text_request_is_popped_generated_and_done(database: str | None) -> None:
    async with open_env(database=database) as env:
        assert env.horde.horde.db.is_sqlite is (database is None)
        worker = await env.text_worker(models=["fake-model"])
        r = await env.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": env.requester},
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
        status = (await env.client.get(f"/api/v2/generate/text/status/{request_id}")).json()
        assert status["done"] is True
        assert status["finished"] == 1
        assert status["generations"][0]["text"] == "echo: Once upon"
        assert status["generations"][0]["worker_name"] == "fake-worker"
