"""What a submit sends to Redis: only what its job can hold.

A generation (a text answer that is not a fault) is taken only for a text
job, and a text job streams no progress: its submit reads no progress lease
and closes no stream, and announces the change (one PUBLISH). A fault may
answer a streamed chat job, so its submit still reads the lease. Counted by
a Redis server of the test's own (``INFO commandstats``), so nothing else
sends to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration._helpers import RedisServer, redis_info, submit_text

pytestmark = pytest.mark.anyio

MODEL = "fake-model"


def command_counts(url: str) -> Counter[str]:
    """Redis's count of each command it processed."""
    stats = redis_info(url, "commandstats")  # cmdstat_<name>: calls=N,usec=...
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(dict(f.split("=") for f in v.split(","))["calls"])
            for name, v in stats.items()
        }
    )


@pytest.fixture
async def horde_on_redis() -> AsyncIterator[tuple[TestHorde, str]]:
    redis = RedisServer()
    redis.start()
    try:
        config = Config().replace(signals={"url": redis.url})
        async with open_horde(config=config) as horde:
            yield horde, redis.url
    finally:
        redis.kill()


async def sent_by_submit(horde: TestHorde, url: str, generation: str, state: str) -> Counter[str]:
    """The commands Redis processed while a text job's answer was submitted."""
    key = await horde.create_key("alice", kudos=100)
    owner = await horde.create_key("bob")
    async with (
        httpx.AsyncClient(base_url=horde.url) as c,
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
    ):
        await submit_text(c, key, "Once upon a time", models=[MODEL])
        job = await worker.pop()
        before = command_counts(url)
        await worker.submit(job["id"], generation, state=state, seed=1)
        after = command_counts(url)
    sent = after - before
    sent["info"] -= 1  # the INFO that read the counts
    return +sent


async def test_a_generation_s_submit_reads_no_lease_and_closes_no_stream(
    horde_on_redis: tuple[TestHorde, str],
) -> None:
    horde, url = horde_on_redis
    assert await sent_by_submit(horde, url, "The end.", "ok") == Counter({"publish": 1})


async def test_a_fault_s_submit_still_reads_the_lease_a_chat_job_may_hold(
    horde_on_redis: tuple[TestHorde, str],
) -> None:
    horde, url = horde_on_redis
    sent = await sent_by_submit(horde, url, "", "faulted")
    assert sent["mget"] == 1, sent
