"""/healthz and /readyz: liveness needs nothing; readiness needs the database
and is withdrawn at shutdown."""

from __future__ import annotations

import anyio
import anyio.abc
import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import open_horde
from tests.integration._chat_helpers import TLS
from tests.integration._helpers import RedisServer, eventually, relayed

pytestmark = pytest.mark.anyio


async def test_healthz_and_readyz_answer_a_serving_horde() -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url, verify=TLS) as c:
        live = await c.get("/healthz")
        assert (live.status_code, live.json()) == (200, {"status": "ok"})
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_readyz_is_withdrawn_once_shutdown_begins() -> None:
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url, verify=TLS) as c:
        horde.horde.begin_shutdown()
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (
            503,
            {"status": "unready", "reason": "stopping"},
        )
        assert (await c.get("/healthz")).status_code == 200  # still alive


@pytest.mark.postgres
async def test_readyz_turns_503_when_the_database_stops_answering(
    postgres_schema_url: str,
) -> None:
    async with relayed(postgres_schema_url) as (relay, url):
        async with (
            open_horde(database=url) as horde,
            httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30) as c,
        ):
            assert (await c.get("/readyz")).status_code == 200
            relay.cut()
            with anyio.fail_after(15):
                ready = await c.get("/readyz")
            assert (ready.status_code, ready.json()) == (
                503,
                {"status": "unready", "reason": "database"},
            )
            assert (await c.get("/healthz")).status_code == 200


async def test_readyz_turns_503_while_the_redis_signals_are_down_and_ready_when_they_return() -> (
    None
):
    redis = RedisServer()
    redis.start()
    try:
        config = Config().replace(signals={"url": redis.url})
        async with (
            open_horde(config=config) as horde,
            httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30) as c,
        ):
            assert (await c.get("/readyz")).status_code == 200
            redis.kill()
            await eventually(lambda: horde.horde.signals.degraded)
            ready = await c.get("/readyz")
            assert (ready.status_code, ready.json()) == (
                503,
                {"status": "unready", "reason": "signals"},
            )
            assert (await c.get("/healthz")).status_code == 200  # still alive

            redis.start()

            async def ready_again() -> bool:
                return (await c.get("/readyz")).status_code == 200

            await eventually(ready_again, within=15)
    finally:
        redis.kill()
