"""Which waiting request a pop takes: kudos, age, aging, anonymous last, the owner's own first."""

from __future__ import annotations

import httpx
import pytest

from hordelite.testing import FakeTextWorker, ManualClock, open_horde
from tests.integration._helpers import submit_text

pytestmark = pytest.mark.anyio

# From the specification: a waiting request gains 50 priority every 10 seconds.
AGING_PER_SECOND = 50 / 10
ANONYMOUS = "0000000000"


async def pop_prompts(worker: FakeTextWorker, count: int) -> list[str]:
    prompts = []
    for _ in range(count):
        job = await worker.pop()
        assert job["id"] is not None
        prompts.append(job["payload"]["prompt"])
    return prompts


async def test_a_pop_takes_the_request_of_the_requester_with_the_most_kudos_first() -> None:
    clock = ManualClock()  # never moved: every request has the same age
    async with open_horde(clock=clock) as horde:
        poor = await horde.create_key("poor", kudos=10)
        middle = await horde.create_key("middle", kudos=50)
        rich = await horde.create_key("rich", kudos=100)
        owner = await horde.create_key("owner")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            for key, prompt in ((poor, "poor"), (middle, "middle"), (rich, "rich")):
                await submit_text(client, key, prompt, models=["m1"])
            assert await pop_prompts(worker, 3) == ["rich", "middle", "poor"]


async def test_among_requesters_with_equal_kudos_the_older_request_is_served_first() -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        # Created first, so an order by user id would put "later" first.
        later = await horde.create_key("later", kudos=50)
        earlier = await horde.create_key("earlier", kudos=50)
        owner = await horde.create_key("owner")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            await submit_text(client, earlier, "older", models=["m1"])
            clock.advance(1)
            await submit_text(client, later, "newer", models=["m1"])
            assert await pop_prompts(worker, 2) == ["older", "newer"]


KUDOS_GAP = 100
BREAK_EVEN = KUDOS_GAP / AGING_PER_SECOND  # 20 s of waiting makes up 100 kudos


@pytest.mark.parametrize("waited", [10, BREAK_EVEN - 1])
async def test_a_newer_richer_request_goes_first_while_the_older_ones_aging_is_below_the_kudos_gap(
    waited: float,
) -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        poor = await horde.create_key("poor", kudos=0)
        rich = await horde.create_key("rich", kudos=KUDOS_GAP)
        owner = await horde.create_key("owner")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            await submit_text(client, poor, "A: old and poor", models=["m1"])
            clock.advance(waited)
            await submit_text(client, rich, "B: new and rich", models=["m1"])
            assert await pop_prompts(worker, 2) == ["B: new and rich", "A: old and poor"]


@pytest.mark.parametrize("waited", [BREAK_EVEN + 1, 30, 200])
async def test_an_older_poorer_request_goes_first_once_its_aging_exceeds_the_kudos_gap(
    waited: float,
) -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        poor = await horde.create_key("poor", kudos=0)
        rich = await horde.create_key("rich", kudos=KUDOS_GAP)
        owner = await horde.create_key("owner")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            await submit_text(client, poor, "A: old and poor", models=["m1"])
            clock.advance(waited)
            await submit_text(client, rich, "B: new and rich", models=["m1"])
            assert await pop_prompts(worker, 2) == ["A: old and poor", "B: new and rich"]


async def test_anonymous_requests_are_served_after_registered_ones_despite_aging() -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        registered = await horde.create_key("registered", kudos=0)
        owner = await horde.create_key("owner")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            await submit_text(client, ANONYMOUS, "anonymous", models=["m1"])
            clock.advance(100)  # aging alone would put it 500 ahead
            await submit_text(client, registered, "registered", models=["m1"])
            assert await pop_prompts(worker, 2) == ["registered", "anonymous"]


async def test_a_workers_owner_is_served_before_richer_users() -> None:
    clock = ManualClock()
    async with open_horde(clock=clock) as horde:
        rich = await horde.create_key("rich", kudos=1000)
        owner = await horde.create_key("owner", kudos=0)
        stranger = await horde.create_key("stranger")
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, name="owners-worker", models=["m1"]) as own_worker,
            FakeTextWorker(
                horde.url, stranger, name="strangers-worker", models=["m1"]
            ) as other_worker,
        ):
            await submit_text(client, rich, "rich 1", models=["m1"])
            clock.advance(1)
            await submit_text(client, rich, "rich 2", models=["m1"])
            clock.advance(1)
            await submit_text(client, owner, "owner's own", models=["m1"])
            # For anyone else's worker the richer requests come first...
            assert await pop_prompts(other_worker, 1) == ["rich 1"]
            # ...but the owner's worker takes the owner's request over the richer one left.
            assert await pop_prompts(own_worker, 2) == ["owner's own", "rich 2"]
