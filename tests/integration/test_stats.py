"""/stats/text/totals and /stats/text/models, as horde_sdk reads them: the
jobs done per period and model, the same before and after the sweep purges
the jobs (their figures rolled up), on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest
from horde_sdk.ai_horde_api.apimodels import TextStatsModelResponse, TextStatsModelsTotalResponse

from hordelite.testing import ManualClock
from tests.integration._env import open_env

pytestmark = pytest.mark.anyio

DAY = 86400
STATS_TTL = 60  # the figures are cached this long


async def read(client: httpx.AsyncClient) -> tuple[dict, dict]:  # type: ignore[type-arg]
    totals = (await client.get("/api/v2/stats/text/totals")).json()
    models = (await client.get("/api/v2/stats/text/models")).json()
    TextStatsModelsTotalResponse.model_validate(totals)
    TextStatsModelResponse.model_validate(models)
    return totals, models


async def test_jobs_done_are_counted_per_period_and_model_before_and_after_the_purge(
    chat_database: str | None,
) -> None:
    # Noon UTC, so that a few hours stay within the day.
    clock = ManualClock(start=20_000 * DAY + DAY / 2)
    async with open_env(
        clock=clock, database=chat_database, retention=60, requester_kudos=1000
    ) as env:
        worker = await env.text_worker(models=["m1", "m2"])
        empty, none = await read(env.client)
        assert empty["total"] == {"requests": 0, "tokens": 0}
        assert none == {"day": {}, "month": {}, "total": {}}

        for model, n in (("m1", 2), ("m2", 1)):
            for _ in range(n):
                await env.submit_text("go", models=[model], max_length=50)
                job = await worker.pop()
                await worker.submit(job["id"], "x" * 200)  # 50 tokens
        clock.advance(STATS_TTL)
        totals, models = await read(env.client)
        for period in ("hour", "day", "month", "total"):
            assert totals[period] == {"requests": 3, "tokens": 150}, period
        assert models["day"] == models["total"] == {"m1": 2, "m2": 1}

        # Past the retention the sweep purges them: the figures stay.
        clock.advance(120)
        await env.horde.sweep()
        clock.advance(STATS_TTL)
        totals, models = await read(env.client)
        assert totals["minute"] == {"requests": 0, "tokens": 0}
        assert (totals["day"], totals["total"]) == ({"requests": 3, "tokens": 150},) * 2
        assert models["total"] == {"m1": 2, "m2": 1}

        clock.advance(2 * DAY)
        later, models = await read(env.client)
        assert later["day"] == {"requests": 0, "tokens": 0}
        assert later["month"] == later["total"] == {"requests": 3, "tokens": 150}
        assert (models["day"], models["month"]) == ({}, {"m1": 2, "m2": 1})
