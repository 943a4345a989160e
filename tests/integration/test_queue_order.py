"""Which waiting request a pop takes: kudos, age, aging, anonymous last, the owner's own first."""

from __future__ import annotations

import pytest

from hordelite.testing import FakeTextWorker, ManualClock
from tests.integration._env import open_env

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
    async with open_env(clock=clock) as env:
        poor = await env.horde.create_key("poor", kudos=10)
        middle = await env.horde.create_key("middle", kudos=50)
        rich = await env.horde.create_key("rich", kudos=100)
        worker = await env.text_worker()
        for key, prompt in ((poor, "poor"), (middle, "middle"), (rich, "rich")):
            await env.submit_text(prompt, key=key)
        assert await pop_prompts(worker, 3) == ["rich", "middle", "poor"]


async def test_among_requesters_with_equal_kudos_the_older_request_is_served_first() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        later = await env.horde.create_key("later", kudos=50)
        earlier = await env.horde.create_key("earlier", kudos=50)
        worker = await env.text_worker()
        await env.submit_text("older", key=earlier)
        clock.advance(1)
        await env.submit_text("newer", key=later)
        assert await pop_prompts(worker, 2) == ["older", "newer"]


KUDOS_GAP = 100
BREAK_EVEN = KUDOS_GAP / AGING_PER_SECOND  # 20 s of waiting makes up 100 kudos


OLD_POOR, NEW_RICH = "A: old and poor", "B: new and rich"


@pytest.mark.parametrize(
    ("waited", "order"),
    [
        (10, [NEW_RICH, OLD_POOR]),
        (BREAK_EVEN - 1, [NEW_RICH, OLD_POOR]),
        (BREAK_EVEN + 1, [OLD_POOR, NEW_RICH]),
        (30, [OLD_POOR, NEW_RICH]),
        (200, [OLD_POOR, NEW_RICH]),
    ],
)
async def test_an_older_poorer_request_goes_first_once_its_aging_exceeds_the_kudos_gap(
    waited: float, order: list[str]
) -> None:
    """Below the gap the newer, richer request goes first; past it the older one."""
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        poor = await env.horde.create_key("poor", kudos=0)
        rich = await env.horde.create_key("rich", kudos=KUDOS_GAP)
        worker = await env.text_worker()
        await env.submit_text(OLD_POOR, key=poor)
        clock.advance(waited)
        await env.submit_text(NEW_RICH, key=rich)
        assert await pop_prompts(worker, 2) == order


async def test_anonymous_requests_are_served_after_registered_ones_despite_aging() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        registered = await env.horde.create_key("registered", kudos=0)
        worker = await env.text_worker()
        await env.submit_text("anonymous", key=ANONYMOUS)
        clock.advance(100)  # aging alone would put it 500 ahead
        await env.submit_text("registered", key=registered)
        assert await pop_prompts(worker, 2) == ["registered", "anonymous"]


async def test_a_workers_owner_is_served_before_richer_users() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        rich = await env.horde.create_key("rich", kudos=1000)
        owner = await env.horde.create_key("owner", kudos=0)
        stranger = await env.horde.create_key("stranger")
        own_worker = await env.text_worker("owners-worker", key=owner)
        other_worker = await env.text_worker("strangers-worker", key=stranger)
        await env.submit_text("rich 1", key=rich)
        clock.advance(1)
        await env.submit_text("rich 2", key=rich)
        clock.advance(1)
        await env.submit_text("owner's own", key=owner)
        # For anyone else's worker the richer requests come first...
        assert await pop_prompts(other_worker, 1) == ["rich 1"]
        # ...but the owner's worker takes the owner's request over the richer one left.
        assert await pop_prompts(own_worker, 2) == ["owner's own", "rich 2"]
