"""/healthz and /readyz: liveness needs nothing; readiness needs the database
and is withdrawn at shutdown; without Redis the horde serves degraded and
stays ready, saying so, unless [signals] ready_when_degraded is false."""

from __future__ import annotations

import anyio
import anyio.abc
import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import open_horde
from tests.integration._env import TLS
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


@pytest.mark.parametrize(
    ("ready_when_degraded", "while_down"),
    [
        (True, (200, {"status": "ready", "signals": "degraded"})),
        (False, (503, {"status": "unready", "reason": "signals"})),
    ],
)
async def test_readyz_while_the_redis_signals_are_down_and_when_they_return(
    ready_when_degraded: bool, while_down: tuple[int, dict[str, str]]
) -> None:
    """By default a horde without Redis stays ready (it serves degraded: a
    load balancer must not drop every replica when their one Redis blips);
    ``ready_when_degraded = false`` withdraws it."""
    redis = RedisServer()
    redis.start()
    try:
        config = Config().replace(
            signals={"url": redis.url, "ready_when_degraded": ready_when_degraded}
        )
        async with (
            open_horde(config=config) as horde,
            httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30) as c,
        ):
            ready = await c.get("/readyz")
            assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
            redis.kill()
            await eventually(lambda: horde.horde.signals.degraded)
            ready = await c.get("/readyz")
            assert (ready.status_code, ready.json()) == while_down
            assert (await c.get("/healthz")).status_code == 200  # still alive

            redis.start()

            async def ready_again() -> bool:
                ready = await c.get("/readyz")
                return (ready.status_code, ready.json()) == (200, {"status": "ready"})

            await eventually(ready_again, within=15)
    finally:
        redis.kill()
