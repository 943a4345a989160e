"""Streamed calls on the OpenAI front (issue 4 "Streaming"; chat guide:
"Streaming", "What a client can rely on": stream order), through the SDK's
stream and as raw server-sent events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import openai
import pytest

from hordelite.contract.chat_reply import FAULT_REASONS
from tests.integration._chat_helpers import MODEL, STRICT, WEATHER_TOOL, pop_nothing
from tests.integration.test_front import (
    ENVELOPE_KEYS,
    Front,
    chat_request,
    open_front,
    open_served_front,
    refusal,
    streamed,
)

pytestmark = pytest.mark.anyio

DONE = "data: [DONE]"

# The SDK's stream stops reading at [DONE] without closing its inner async
# generators (its SSE decoder's, httpx's and httpcore's byte iterators). On asyncio they
# are closed silently when collected; trio closes them too but warns with a
# ResourceWarning, which this suite turns into an error. The warning is the
# SDK's, not the front's: ignored for the tests iterating the SDK's stream.
sdk_stream = pytest.mark.filterwarnings(
    "ignore:Async generator '(openai|httpx|httpcore)\\.:ResourceWarning"
)


def body(content: str = "Name one colour.", **fields: Any) -> dict[str, Any]:
    """A streamed call's body (``stream`` True unless ``fields`` say otherwise)."""
    return chat_request(content, **{"stream": True, **fields})


async def raw_stream(
    front: Front,
    request: dict[str, Any],
    on_line: Callable[[str], None] = lambda line: None,
) -> tuple[httpx.Response, list[str]]:
    """POST a streamed call; returns the response and its non-empty lines,
    calling ``on_line`` on each as it arrives."""
    lines: list[str] = []
    async with front.open_stream(request) as response:
        async for line in response.aiter_lines():
            if line:
                lines.append(line)
                on_line(line)
    return response, lines


def data_events(lines: list[str]) -> list[Any]:
    """The JSON of every data line but [DONE]."""
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]


# The order of a stream --------------------------------------------------------------


@sdk_stream
async def test_a_streamed_completion_sends_role_content_finish_then_a_usage_chunk_with_no_choice() -> (
    None
):
    async with open_served_front() as (front, worker, client):
        chunks = await streamed(client, worker.serve_one, stream_options={"include_usage": True})
        request_id = chunks[0].id.removeprefix("chatcmpl-")
        assert all(c.id == f"chatcmpl-{request_id}" for c in chunks)
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert all(c.model == MODEL for c in chunks)
        *with_choice, last = chunks
        # The role first, then content, then one finish chunk closing the choice.
        assert with_choice[0].choices[0].delta.role == "assistant"
        assert with_choice[-1].choices[0].finish_reason == "stop"
        assert [c.choices[0].finish_reason for c in with_choice[:-1]] == [None] * (
            len(with_choice) - 1
        )
        content = "".join(c.choices[0].delta.content or "" for c in with_choice)
        assert content == "reply to: Name one colour."
        assert all(c.usage is None for c in with_choice)
        # Then the usage chunk: no choice.
        assert last.choices == []
        assert last.usage is not None
        assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
        # The id is the horde request's, which holds the same reply.
        status = await front.env.status(request_id)
        assert status["generations"][0]["message"]["content"] == content


@sdk_stream
async def test_a_streamed_completion_without_include_usage_has_no_usage_chunk() -> None:
    async with open_served_front() as (_, worker, client):
        chunks = await streamed(client, worker.serve_one)
        assert all(len(c.choices) == 1 for c in chunks)
        assert all(c.usage is None for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_stream_ends_with_done_right_after_the_usage_chunk() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve_one)
            response, lines = await raw_stream(front, body(stream_options={"include_usage": True}))
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        # The stream's headers go out once the horde holds the request.
        assert response.headers["x-should-retry"] == "false"
        data = [line for line in lines if line.startswith("data: ")]
        assert data[-1] == DONE
        assert data.count(DONE) == 1
        usage_chunk = json.loads(data[-2][len("data: ") :])
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"]["total_tokens"] > 0
        assert usage_chunk["x_horde"]["request_id"] == usage_chunk["id"].removeprefix("chatcmpl-")


@sdk_stream
async def test_a_streamed_tool_call_reply_sends_the_calls_in_one_chunk_before_the_finish() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    reply = {
        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        "finish_reason": "tool_calls",
    }
    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=lambda job: reply)
        client = await front.sdk()
        chunks = await streamed(
            client, worker.serve_one, content="What is the weather in Paris?", tools=[WEATHER_TOOL]
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        with_calls = [c for c in chunks if c.choices[0].delta.tool_calls]
        assert len(with_calls) == 1
        (delta,) = with_calls[0].choices[0].delta.tool_calls or []
        assert delta.index == 0
        assert delta.id == "call_1"
        assert delta.function is not None
        assert delta.function.name == "get_weather"
        assert json.loads(delta.function.arguments or "") == {"city": "Paris"}
        assert chunks.index(with_calls[0]) < len(chunks) - 1
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


# Waiting ----------------------------------------------------------------------------------


async def test_a_waiting_stream_gets_keepalive_comments_then_its_reply() -> None:
    async with open_front({"keepalive_interval": 0.1}) as front:
        worker = await front.worker("w1")
        async with anyio.create_task_group() as tg:

            def on_line(line: str) -> None:
                # The worker serves the job only once a keep-alive arrived.
                if line.startswith(":") and not started:
                    started.append(True)
                    tg.start_soon(worker.serve_one)

            started: list[bool] = []
            # Without a keep-alive the worker never serves: fail, do not hang.
            with anyio.fail_after(10):
                response, lines = await raw_stream(front, body(), on_line)
        assert response.status_code == 200
        assert started
        comments = [line for line in lines if line.startswith(":")]
        assert comments
        # Nothing but comments and data lines: OpenAI clients skip the comments.
        assert all(line.startswith(("data: ", ":")) for line in lines)
        assert lines[-1] == DONE
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in data_events(lines))
        assert content == "reply to: Name one colour."


async def test_a_client_that_leaves_a_waiting_stream_gets_its_request_cancelled() -> None:
    async with open_front({"keepalive_interval": 0.1}) as front:
        worker = await front.worker("w1")
        kudos = await front.env.kudos()

        async def leave_after_the_headers(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with front.open_stream(body()) as response:
                assert response.status_code == 200
                task_status.started()
                await anyio.sleep_forever()

        # The client goes away while its stream waits for a worker.
        await front.leave_once_queued(leave_after_the_headers)
        await pop_nothing(worker)
        assert await front.env.kudos() == kudos


# Errors after the headers ---------------------------------------------------------------


async def test_an_error_after_the_stream_opened_is_one_error_event_without_a_choice_then_done() -> (
    None
):
    # max_faults 0: the first fault ends the request.
    async with open_front(max_faults=0) as front:
        worker = await front.worker("w1")

        async def fault() -> None:
            job = await worker.pop(wait=10)
            assert (await worker.fault(job, "backend_error")).status_code == 200

        async with anyio.create_task_group() as tg:
            tg.start_soon(fault)
            response, lines = await raw_stream(front, body())
        assert response.status_code == 200
        data = [line for line in lines if line.startswith("data: ")]
        assert data[-1] == DONE
        events = data_events(lines)
        errors = [e for e in events if "error" in e]
        assert len(errors) == 1
        (event,) = errors
        # The error is the last event before [DONE] and carries no choice.
        assert events[-1] is event
        assert set(event) == {"error"}
        assert set(event["error"]) == ENVELOPE_KEYS
        assert event["error"]["code"] == "ChatRequestFaulted"
        assert event["error"]["message"] == FAULT_REASONS["backend_error"]
        # No finish reason was made up, and no content.
        for chunk in events[:-1]:
            (choice,) = chunk["choices"]
            assert choice["finish_reason"] is None
            assert not choice["delta"].get("content")
        status = await front.env.status(event["error"]["metadata"]["request_id"])
        assert status["faulted"] is True


@sdk_stream
async def test_the_sdk_raises_the_error_event_of_a_stream_as_an_api_error() -> None:
    async with open_served_front(max_faults=0) as (front, worker, client):

        async def fault() -> None:
            job = await worker.pop(wait=10)
            assert (await worker.fault(job, "backend_error")).status_code == 200

        chunks: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(fault)
            stream = await client.chat.completions.create(**body())

            async def read_all() -> None:
                async for chunk in stream:
                    chunks.append(chunk)

            with pytest.raises(openai.APIError) as caught:
                await read_all()
        assert type(caught.value) is openai.APIError
        assert caught.value.message == FAULT_REASONS["backend_error"]
        assert caught.value.code == "ChatRequestFaulted"
        # No content and no made-up finish reason reached the client.
        assert all(c.choices[0].finish_reason is None for c in chunks)
        assert all(not c.choices[0].delta.content for c in chunks)
        assert len(front.sent) == 1


async def test_a_streamed_call_past_the_deadline_ends_with_a_timeout_event_and_cancels_the_request() -> (
    None
):
    async with open_front({"timeout": 0.5, "recheck_interval": 0.2}) as front:
        worker = await front.worker("w1")  # online and eligible, never pops again
        response, lines = await raw_stream(front, body())
        assert response.status_code == 200
        assert lines[-1] == DONE
        events = data_events(lines)
        event = events[-1]
        assert set(event) == {"error"}
        assert event["error"]["code"] == "RequestTimeout"
        assert all(
            "error" not in e and e["choices"][0]["finish_reason"] is None for e in events[:-1]
        )
        await front.assert_cancelled(event["error"]["metadata"]["request_id"])
        await pop_nothing(worker)


async def test_stream_options_without_stream_is_refused_400() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk()
        refused = await refusal(
            client, raises=openai.BadRequestError, stream_options={"include_usage": True}
        )
        assert refused.status_code == 400
        assert refused.param == "stream_options"
        assert "x-should-retry" not in refused.response.headers
        assert await front.queued() == 0
