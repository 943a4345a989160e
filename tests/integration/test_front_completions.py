"""OpenAI's legacy completions on the front (``POST /v1/completions``,
decision 0057), driven by the official ``openai`` package's
``completions.create``, plain and streamed, against text workers.

Each call becomes a native text request: the tests read what the worker is
handed in its pop (the prompt, max_length, stop sequences, samplers and the
context chosen) and what the client gets back.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import openai
import pytest

from hordelite.config import Config
from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration._helpers import text_status

pytestmark = pytest.mark.anyio

MODEL = "m1"


@contextlib.asynccontextmanager
async def front(**horde: Any) -> AsyncIterator[tuple[TestHorde, openai.AsyncOpenAI, str]]:
    """A horde, an SDK client of a funded user, and a worker owner's key."""
    config = horde.pop("config", None)
    async with open_horde(config=config, **horde) as h:
        key = await h.create_key("alice", kudos=10_000)
        owner = await h.create_key("bob")
        async with openai.AsyncOpenAI(
            base_url=h.url + "/v1", api_key=key, max_retries=0, timeout=30
        ) as client:
            yield h, client, owner


async def served(worker: FakeTextWorker, call: Any) -> tuple[Any, dict[str, Any]]:
    """Run the SDK ``call`` while ``worker`` pops its job and submits; the
    call's answer and the job the worker was handed."""
    answer: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            answer.append(await call())

        tg.start_soon(run)
        job = await worker.serve_one(wait=10)
    assert job is not None
    return answer[0], job


async def test_a_completion_is_a_text_request_answered_in_openais_shape() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(horde.url, owner, name="w1", models=[MODEL]) as worker,
    ):
        await worker.pop()  # online
        answer, job = await served(
            worker,
            lambda: client.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=40, stop=["\n\n", "THE END"]
            ),
        )
        payload = job["payload"]
        assert payload["prompt"] == "Once upon a time"
        assert payload["max_length"] == 40
        assert payload["stop_sequence"] == ["\n\n", "THE END"]
        # OpenAI's defaults where left out; the backend's own samplers neutral.
        assert (payload["temperature"], payload["top_p"]) == (1.0, 1.0)
        assert (payload["rep_pen"], payload["top_k"], payload["min_p"]) == (1.0, 0, 0.0)
        assert answer.object == "text_completion"
        assert answer.id.startswith("cmpl-")
        assert answer.model == MODEL
        choice = answer.choices[0]
        assert choice.text == worker.generate("Once upon a time")
        assert choice.finish_reason == "stop"
        assert choice.index == 0
        usage = answer.usage
        assert usage is not None
        assert usage.prompt_tokens == 4  # 16 characters, 4 a token
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        extra = answer.model_extra["x_horde"]
        assert extra["worker"]["name"] == "w1"
        assert extra["estimated_usage"] is True
        request_id = answer.id.removeprefix("cmpl-")
        async with httpx.AsyncClient(base_url=horde.url) as http:
            status = await text_status(http, request_id)
        assert status["done"] is True
        assert status["kudos"] == extra["kudos"] > 0


# The SDK leaves its event generators to the garbage collector after [DONE]
# (it breaks out of them), which trio reports as an unclosed async generator:
# the SDK's stream is read on asyncio; the same stream over httpx on both.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_streamed_completion_sends_the_text_then_its_finish_and_usage() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
    ):
        await worker.pop()

        async def stream() -> list[Any]:
            async with await client.completions.create(
                model=MODEL,
                prompt="Tell me",
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
            ) as chunks:
                return [c async for c in chunks]

        chunks, _ = await served(worker, stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == worker.generate("Tell me")
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "stop"
        assert set(finishes[:-1]) == {None}
        assert all(c.object == "text_completion" for c in chunks)
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == 2


async def test_a_streamed_completion_read_as_server_sent_events() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
        httpx.AsyncClient(base_url=horde.url, timeout=30) as http,
    ):
        await worker.pop()

        async def stream() -> list[str]:
            body = {"model": MODEL, "prompt": "Tell me", "stream": True}
            headers = {"Authorization": f"Bearer {client.api_key}"}
            async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                return [line async for line in r.aiter_lines() if line.startswith("data: ")]

        lines, _ = await served(worker, stream)
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert "".join(e["choices"][0]["text"] for e in events) == worker.generate("Tell me")
        assert [e["choices"][0]["finish_reason"] for e in events] == [None, "stop"]


async def test_echo_puts_the_prompt_before_the_text() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
    ):
        await worker.pop()
        answer, _ = await served(
            worker, lambda: client.completions.create(model=MODEL, prompt="Hi", echo=True)
        )
        assert answer.choices[0].text == "Hi" + worker.generate("Hi")


async def test_the_context_is_the_smallest_offered_that_holds_the_prompt() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(
            horde.url, owner, name="small", models=[MODEL], max_context_length=2048
        ) as small,
        FakeTextWorker(
            horde.url, owner, name="big", models=[MODEL], max_context_length=16384
        ) as big,
    ):
        await small.pop()
        await big.pop()
        # 3000 bytes cannot be shown to fit 2048 tokens: only "big" may take it.
        long_prompt = "word " * 600
        answer, job = await served(
            big, lambda: client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=16)
        )
        assert job["payload"]["max_context_length"] == 16384
        extra = answer.model_extra["x_horde"]
        assert (extra["context_length"], extra["prompt_may_be_trimmed"]) == (16384, False)
        # A short one fits the small worker's context: both may take it.
        answer, job = await served(
            small, lambda: client.completions.create(model=MODEL, prompt="Hi", max_tokens=16)
        )
        assert job["payload"]["max_context_length"] == 2048
        # Larger than any offered: the largest, and the answer says it may be trimmed.
        huge = "word " * 4000
        answer, job = await served(
            big, lambda: client.completions.create(model=MODEL, prompt=huge, max_tokens=16)
        )
        extra = answer.model_extra["x_horde"]
        assert (extra["context_length"], extra["prompt_may_be_trimmed"]) == (16384, True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 1}, "logprobs"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "tail"}, "suffix"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"seed": 7}, "seed"),
        ({"top_p": 0}, "top_p"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"top_k": 40}}, "top_k"),
        ({"extra_body": {"horde": {"webhook": "https://x"}}}, "horde.webhook"),
    ],
)
async def test_what_the_text_path_cannot_honour_is_refused_naming_its_key(
    fields: dict[str, Any], param: str
) -> None:
    async with front() as (horde, client, _):
        args: dict[str, Any] = {"model": MODEL, "prompt": "Hi", **fields}
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(**args)
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["param"] == param, body
        async with httpx.AsyncClient(base_url=horde.url) as http:
            r = await http.get("/api/v2/status/performance")
        assert r.json()["queued_text_requests"] == 0  # nothing queued


async def test_the_horde_objects_samplers_reach_the_worker() -> None:
    async with (
        front() as (horde, client, owner),
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
    ):
        await worker.pop()
        _, job = await served(
            worker,
            lambda: client.completions.create(
                model=MODEL, prompt="Hi", extra_body={"horde": {"top_k": 40, "rep_pen": 1.1}}
            ),
        )
        assert (job["payload"]["top_k"], job["payload"]["rep_pen"]) == (40, 1.1)


async def test_a_call_that_times_out_cancels_its_text_request() -> None:
    config = Config().replace(front={"timeout": 2})
    async with (
        front(config=config) as (horde, client, owner),
        FakeTextWorker(horde.url, owner, models=[MODEL]) as worker,
    ):
        await worker.pop()  # online, then never pops again until the call is over
        with pytest.raises(openai.APIStatusError) as caught:
            await client.completions.create(model=MODEL, prompt="Slow")
        assert caught.value.status_code == 408
        body = caught.value.body
        assert isinstance(body, dict)
        request_id = body["metadata"]["request_id"]
        async with httpx.AsyncClient(base_url=horde.url) as http:
            status = await text_status(http, request_id)
        assert (status["done"], status["generations"], status["waiting"]) == (True, [], 0)
        assert (await worker.pop())["id"] is None  # nothing left to pop
