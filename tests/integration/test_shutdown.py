"""A stopping horde answers what it holds open: waiting pops and OpenAI calls."""

from __future__ import annotations

import anyio
import httpx
import pytest

from hordelite.testing import FakeChatWorker, FakeTextWorker, open_horde
from tests.integration._helpers import eventually

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


@pytest.mark.parametrize("submit", ["submitted", "never"])
async def test_a_stop_serves_the_workers_submit_to_an_open_call_within_the_grace_period(
    submit: str,
) -> None:
    # A horde without Redis: the worker's submit can reach only this
    # process. The stop keeps serving while an open call's worker has its
    # job (the submit comes on a new connection: a job outlasts a kept-alive
    # one), refuses new work meanwhile, and ends within the grace period.
    grace = 6.0
    answers: dict[str, httpx.Response] = {}
    async with anyio.create_task_group() as tg:
        async with open_horde(grace_period=grace) as horde:
            owner = await horde.create_key("bob")
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

            async def call(name: str) -> None:
                async with httpx.AsyncClient(base_url=horde.url) as caller:
                    answers[name] = await caller.post("/v1/chat/completions", json=body, timeout=30)

            async with FakeChatWorker(horde.url, owner, model_id="m") as worker:
                await worker.pop()  # online, declares the model
                tg.start_soon(call, "open")
                with anyio.fail_after(10):
                    job = await worker.pop(wait=10)
                assert job["id"] is not None

                async def during_the_stop() -> None:
                    await eventually(lambda: horde.horde.stopping)
                    await call("new")  # new work is refused at once
                    if submit == "submitted":
                        async with httpx.AsyncClient(base_url=horde.url + "/api/v2") as fresh:
                            reply = {
                                "id": job["id"],
                                "model_id": "m",
                                "state": "ok",
                                "message": {"role": "assistant", "content": "Blue."},
                                "finish_reason": "stop",
                            }
                            answers["submit"] = await fresh.post(
                                "/generate/text/submit", json=reply, headers={"apikey": owner}
                            )

                tg.start_soon(during_the_stop)
                stopping = anyio.current_time()
        # Leaving open_horde stopped it.
        stopped = anyio.current_time() - stopping
    assert stopped < grace + 1
    assert answers["new"].status_code == 503, answers["new"].text
    assert answers["new"].json()["error"]["code"] == "ShuttingDown"
    if submit == "submitted":
        assert answers["submit"].status_code == 200, answers["submit"].text
        assert answers["open"].status_code == 200, answers["open"].text
        assert answers["open"].json()["choices"][0]["message"]["content"] == "Blue."
        # Answered as soon as its reply came: the stop did not wait out its grace.
        assert stopped < grace - 1
    else:
        assert answers["open"].status_code == 503, answers["open"].text
        assert answers["open"].json()["error"]["code"] == "ShuttingDown"
