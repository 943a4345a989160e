"""storage.prepared_statements reaches the server's PostgreSQL connections
(decision 0068): on, a text cycle leaves its statements prepared on the
session; off (behind a pooler in transaction mode), it prepares none and
the cycle still completes. One pooled connection, so that the session read
afterwards is the one the cycle ran on.
"""

from __future__ import annotations

import httpx
import pytest

from hordelite.config import Config
from tests.integration._env import open_env
from tests.integration._helpers import submit_text

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

MODEL = "fake-model"


@pytest.mark.parametrize("prepared", [True, False])
async def test_a_text_cycle_prepares_its_statements_only_when_configured(
    postgres_schema_url: str, prepared: bool
) -> None:
    config = Config().replace(storage={"pool_size": 1, "prepared_statements": prepared})
    async with open_env(config=config, database=postgres_schema_url) as env:
        worker = await env.text_worker(models=[MODEL])
        async with httpx.AsyncClient(base_url=env.horde.url) as c:
            request_id = await submit_text(c, env.requester, "Once upon a time", models=[MODEL])
            job = await worker.pop()
            await worker.submit(job["id"], "The end.", state="ok", seed=1)
            status = (await c.get(f"/api/v2/generate/text/status/{request_id}")).json()

        prepared_here = await env.horde.horde.db.read(
            lambda conn: conn.exec_driver_sql(
                "SELECT count(*) FROM pg_prepared_statements WHERE left(name, 3) = 'hl_'"
            ).scalar_one()
        )

    assert status["done"]
    assert status["generations"][0]["text"] == "The end."
    assert (prepared_here > 0) is prepared
