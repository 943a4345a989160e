"""A stopping horde answers what it holds open: waiting pops and OpenAI calls."""

from __future__ import annotations

import anyio
import httpx
import pytest

from hordelite.testing import FakeChatWorker, FakeTextWorker, open_horde

pytestmark = pytest.mark.anyio


async def _until_online(client: httpx.AsyncClient, name: str) -> None:
    """The pop checked its worker in before it began to wait: poll the listing."""
    with anyio.fail_after(10):
        while True:
            listed = (await client.get("/api/v2/workers")).json()
            if any(w["name"] == name for w in listed):
                return
            await anyio.sleep(0.01)


async def test_a_long_polling_pop_gets_its_empty_answer_when_the_horde_stops() -> None:
    answers: list[dict[str, object]] = []
    async with anyio.create_task_group() as tg:
        async with open_horde() as horde:
            owner = await horde.create_key("bob")
            async with httpx.AsyncClient(base_url=horde.url) as client:
                worker = FakeTextWorker(horde.url, owner, name="waiter")

                async def pop() -> None:
                    async with worker:
                        answers.append(await worker.pop(wait=30))

                tg.start_soon(pop)
                await _until_online(client, "waiter")
            started = anyio.current_time()
        # Leaving open_horde stopped it: the 30 s pop was answered at once,
        # well inside the 2 s grace after which it would be cut off unanswered.
        assert anyio.current_time() - started < 2
    assert answers == [
        {"id": None, "ids": [], "payload": {}, "skipped": {}, "softprompt": None, "messages": []}
    ]


async def test_an_open_openai_call_gets_a_final_503_and_its_request_is_cancelled_at_shutdown() -> (
    None
):
    answers: list[httpx.Response] = []
    async with anyio.create_task_group() as tg:
        async with open_horde() as horde:
            owner = await horde.create_key("bob")
            async with FakeChatWorker(horde.url, owner, model_id="m") as worker:
                await worker.pop()  # online, declares the model; never serves
            async with httpx.AsyncClient(base_url=horde.url) as client:

                async def call() -> None:
                    async with httpx.AsyncClient(base_url=horde.url) as caller:
                        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
                        answers.append(
                            await caller.post("/v1/chat/completions", json=body, timeout=30)
                        )

                tg.start_soon(call)
                # The call is held once its request is queued (status/models
                # counts it, within its 2 s cache).
                with anyio.fail_after(10):
                    while True:
                        if (await client.get("/api/v2/status/models?type=text")).json()[0]["jobs"]:
                            break
                        await anyio.sleep(0.05)
    (answer,) = answers
    assert answer.status_code == 503
    assert answer.headers["x-should-retry"] == "false"
    assert answer.json()["error"]["code"] == "ShuttingDown"
