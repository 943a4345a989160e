"""Anthropic's Messages API served by the front (issue 38, decision 0079,
docs/reference/messages_api.md), driven by the real ``anthropic`` package
over real HTTP against fake chat workers, on trio and asyncio.

A Messages call is a chat request run by the chat front's runner: these
tests check what the route adds (the translation on the wire, the Message
and its stream, Anthropic's envelope, the key headers, the beta flags, the
models list's shape, ``HEAD /``) and that a refusal stores nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import anyio
import httpx
import pytest
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.storage.schema import requests
from hordelite.testing import open_horde
from tests.chat_shapes import tool_call
from tests.integration._chat_helpers import MODEL, STRICT, pop_nothing
from tests.integration._env import TLS
from tests.integration.test_front import Front, open_front

pytestmark = pytest.mark.anyio

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
VERSION = {"anthropic-version": "2023-06-01"}
# What the SDK's stream and Claude Code's read: every event's name, in order.
PLAIN_STREAM = [
    "message_start",
    "ping",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def call_body(content: str = "Name one colour.", **fields: Any) -> dict[str, Any]:
    """A Messages body for MODEL with one user message, at most 64 tokens."""
    return {"model": MODEL, "max_tokens": 64, "messages": [user(content)], **fields}


async def sdk(front: Front, *, api_key: str | None = None) -> anthropic.AsyncAnthropic:
    """The anthropic SDK with the requester's key (sent as Bearer, as the
    SDK sends it), no retries: a refusal reaches the test as it came."""
    client = anthropic.AsyncAnthropic(
        base_url=front.url, api_key=api_key or front.env.requester, max_retries=0
    )
    return await front.env.stack.enter_async_context(client)


async def beside(serve: Callable[[], Awaitable[object]], call: Awaitable[Any]) -> Any:
    """``call``'s result, with the worker's ``serve`` running beside it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        return await call


async def stored(front: Front) -> int:
    """Requests the horde holds, in any state."""

    def count(conn: Any) -> int:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())

    return await front.env.horde.horde.db.read(count)


def events_of(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """A server-sent event stream's (event name, data) pairs."""
    out = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


# A plain call ---------------------------------------------------------------------------


async def test_messages_create_answers_a_message_of_the_request_with_usage_and_x_horde() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        client = await sdk(front)
        message = await beside(
            worker.serve_one,
            client.messages.create(**call_body(), system="Answer briefly."),
        )
        assert isinstance(message, anthropic.types.Message)
        x_horde = message.model_extra["x_horde"]  # type: ignore[index]
        request_id = x_horde["request_id"]
        assert message.id == f"msg_{request_id}"
        assert message.role == "assistant"
        assert message.model == MODEL
        assert [block.type for block in message.content] == ["text"]
        assert message.content[0].text == "reply to: Name one colour."  # type: ignore[union-attr]
        assert message.stop_reason == "end_turn"
        assert message.stop_sequence is None
        assert message.usage.input_tokens > 0
        assert message.usage.output_tokens > 0
        assert message.usage.cache_read_input_tokens == 0
        # The native status of the same id: the same reply, charged.
        status = await front.env.status(request_id)
        assert status["done"] is True
        assert status["kudos"] == x_horde["kudos"] > 0
        assert x_horde["worker"]["name"] == "w1"
        assert x_horde["estimated_usage"] is True


async def test_the_worker_gets_the_messages_call_as_a_chat_job() -> None:
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return {"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}

    async with open_front() as front:
        worker = await front.worker("w1", reply=reply)
        client = await sdk(front)
        await beside(
            worker.serve_one,
            client.messages.create(
                **call_body("Name one colour."),
                system=[
                    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
                ],
                stop_sequences=["\n\n"],
                extra_body={"temperature": 0.5},
            ),
        )
        payload = jobs[0]["payload"]
        assert payload["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name one colour."},
        ]
        assert payload["stop_sequence"] == ["\n\n"]
        assert payload["temperature"] == 0.5
        assert payload["max_length"] == 64


async def test_a_max_tokens_over_the_hordes_bound_is_lowered_and_said_so() -> None:
    """Claude Code asks for 32000 tokens on every call: lowered to 4096, then by
    admission to the worker's max_length, each said in context_adjustments."""
    async with open_front() as front:
        worker = await front.worker("w1")
        client = await sdk(front)
        # A timeout of its own: the SDK asks a call this long to stream otherwise.
        message = await beside(
            worker.serve_one, client.messages.create(**call_body(max_tokens=32000), timeout=60)
        )
        adjustments = message.model_extra["x_horde"]["context_adjustments"]  # type: ignore[index]
        assert adjustments[0]["field"] == "max_tokens"
        assert (adjustments[0]["requested"], adjustments[0]["applied"]) == (32000, 4096)
        assert adjustments[-1]["applied"] == 1024  # the fake worker's max_length


# Streaming ---------------------------------------------------------------------------


async def test_messages_stream_gives_the_text_and_the_final_message() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        client = await sdk(front)

        async def read() -> tuple[list[str], anthropic.types.Message]:
            async with client.messages.stream(**call_body()) as stream:
                texts = [text async for text in stream.text_stream]
                return texts, await stream.get_final_message()

        texts, final = await beside(worker.serve_one, read())
        assert "".join(texts) == "reply to: Name one colour."
        assert final.content[0].text == "reply to: Name one colour."  # type: ignore[union-attr]
        assert final.stop_reason == "end_turn"
        assert final.usage.output_tokens > 0
        assert final.id.startswith("msg_")


async def test_a_streamed_call_sends_anthropics_events_in_order() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")

        async def read() -> httpx.Response:
            return await front.http.post(
                MESSAGES,
                headers={"x-api-key": front.env.requester, **VERSION},
                json=call_body(stream=True),
            )

        answer = await beside(worker.serve_one, read())
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["x-should-retry"] == "false"
        events = events_of(answer.text)
        assert [name for name, _ in events] == PLAIN_STREAM
        assert all(data["type"] == name for name, data in events)
        assert events[0][1]["message"]["model"] == MODEL
        assert events[3][1]["delta"] == {"type": "text_delta", "text": "reply to: Name one colour."}
        assert events[5][1]["delta"]["stop_reason"] == "end_turn"
        assert events[5][1]["x_horde"]["request_id"]


async def test_a_streamed_call_relays_the_workers_progress_posts() -> None:
    """A plain streamed call's job streams progress: the worker's posts reach
    the client as text deltas before its reply is submitted."""
    async with open_front({"pace_progress": False}) as front:
        worker = await front.worker("w1")
        client = await sdk(front)
        seen = anyio.Event()

        async def serve() -> None:
            job = await worker.pop(wait=10)
            assert job["payload"]["stream_progress"] is True, job
            posted = await worker.client.post(
                "/generate/text/progress",
                json={"id": job["id"], "seq": 1, "delta": {"content": "Blue"}},
            )
            assert posted.status_code == 200, posted.text
            await seen.wait()  # the client has the post before the reply exists
            reply = {"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}
            submitted = await worker.submit_reply(job, reply)
            assert submitted.status_code == 200, submitted.text

        async def read() -> list[str]:
            texts = []
            async with client.messages.stream(**call_body()) as stream:
                async for text in stream.text_stream:
                    texts.append(text)
                    seen.set()
            return texts

        assert await beside(serve, read()) == ["Blue", "."]


# Tools ---------------------------------------------------------------------------------


async def test_a_tool_round_trip_a_tool_use_answered_by_a_tool_result() -> None:
    jobs: list[dict[str, Any]] = []
    call = tool_call("call_1", "get_weather", '{"city": "Paris"}')

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        if len(jobs) == 1:
            return {
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        return {
            "message": {"role": "assistant", "content": "Take no umbrella."},
            "finish_reason": "stop",
        }

    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=reply)
        client = await sdk(front)
        messages: list[Any] = [user("What is the weather in Paris?")]
        first = await beside(
            worker.serve_one,
            client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[WEATHER]),
        )
        assert first.stop_reason == "tool_use"
        [use] = first.content
        assert use.type == "tool_use"
        assert (use.id, use.name, use.input) == ("call_1", "get_weather", {"city": "Paris"})

        # The SDK's tool loop: the assistant's content as returned, then the result.
        messages.append({"role": "assistant", "content": first.content})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
        messages.append(user([result]))
        second = await beside(
            worker.serve_one,
            client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[WEATHER]),
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].text == "Take no umbrella."  # type: ignore[union-attr]
        history = jobs[1]["payload"]["messages"]
        assert [m["role"] for m in history] == ["user", "assistant", "tool"]
        assert history[1]["tool_calls"] == [call]
        assert history[2]["tool_call_id"] == "call_1"
        assert history[2]["content"] == "18 C and sunny"
        assert jobs[1]["payload"]["tools"][0]["function"]["name"] == "get_weather"


async def test_a_streamed_tool_call_is_a_tool_use_block_and_names_the_model_that_served() -> None:
    """A call with tools streams from the finished reply: message_start names
    the model that served (the second the call accepts), then the tool_use
    block with its input as one input_json_delta."""
    call = tool_call("call_1", "get_weather", '{"city": "Paris"}')

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        return {
            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            "finish_reason": "tool_calls",
        }

    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=reply)
        body = {
            "models": ["another-model", MODEL],
            "max_tokens": 64,
            "messages": [user("What is the weather in Paris?")],
            "tools": [WEATHER],
            "stream": True,
        }
        headers = {"x-api-key": front.env.requester, **VERSION}
        answer = await beside(
            worker.serve_one, front.http.post(MESSAGES, headers=headers, json=body)
        )
        assert answer.status_code == 200, answer.text
        events = events_of(answer.text)
        assert [name for name, _ in events] == PLAIN_STREAM
        assert events[0][1]["message"]["model"] == MODEL
        assert events[2][1]["content_block"] == {
            "type": "tool_use",
            "id": "call_1",
            "name": "get_weather",
            "input": {},
        }
        assert events[3][1]["delta"] == {
            "type": "input_json_delta",
            "partial_json": '{"city": "Paris"}',
        }
        assert events[5][1]["delta"]["stop_reason"] == "tool_use"


# count_tokens ------------------------------------------------------------------------


async def test_count_tokens_estimates_the_input_and_queues_nothing() -> None:
    async with open_front() as front:
        client = await sdk(front)
        counted = await client.messages.count_tokens(
            model=MODEL, messages=[user("Name one colour.")], system="Be brief."
        )
        # "system: Be brief.\nuser: Name one colour." at 4 characters a token.
        assert counted.input_tokens == 10
        assert counted.model_extra == {"x_horde": {"estimated_usage": True}}
        assert await stored(front) == 0


async def test_count_tokens_refuses_what_only_shapes_a_reply_by_field() -> None:
    async with open_front() as front:
        client = await sdk(front)
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.count_tokens(
                model=MODEL,
                messages=[user("Hi")],
                extra_body={"max_tokens": 64},
            )
        assert caught.value.body["error"]["param"] == "max_tokens"  # type: ignore[index]
        assert await stored(front) == 0


# Keys ----------------------------------------------------------------------------------


async def test_the_key_is_taken_from_x_api_key_before_authorization() -> None:
    """Claude Code's x-api-key carries the key; an Authorization header
    beside it (not Bearer, so it would be refused) is not read."""
    async with open_front() as front:
        worker = await front.worker("w1")
        headers = {
            "x-api-key": front.env.requester,
            "Authorization": "Basic nothing",
            **VERSION,
        }
        answer = await beside(
            worker.serve_one, front.http.post(MESSAGES, headers=headers, json=call_body())
        )
        assert answer.status_code == 200, answer.text
        request_id = answer.json()["x_horde"]["request_id"]
        # Charged to the requester, whose key it was.
        assert (await front.env.status(request_id))["kudos"] > 0


@pytest.mark.parametrize(
    "headers",
    [{"x-api-key": "no-such-key"}, {"Authorization": "Bearer no-such-key"}],
    ids=["x-api-key", "bearer"],
)
async def test_an_unknown_key_is_401_authentication_error_with_nothing_stored(
    headers: dict[str, str],
) -> None:
    async with open_front() as front:
        await front.worker("w1")
        answer = await front.http.post(MESSAGES, headers={**headers, **VERSION}, json=call_body())
        assert answer.status_code == 401, answer.text
        body = answer.json()
        assert body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        assert body["error"]["code"] == "InvalidAPIKey"
        assert await stored(front) == 0


async def test_a_blank_x_api_key_is_401_and_not_the_anonymous_key() -> None:
    async with open_front() as front:
        await front.worker("w1")
        answer = await front.http.post(
            MESSAGES, headers={"x-api-key": "", **VERSION}, json=call_body()
        )
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["type"] == "authentication_error"
        assert await stored(front) == 0


# Refusals, by field, in Anthropic's envelope -------------------------------------------

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": 5}, "top_k"),
    ({"mcp_servers": []}, "mcp_servers"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"thinking": {"type": "between_tools"}}, "thinking.type"),
    ({"output_config": {"effort": "max"}}, "output_config.effort"),
    (
        {"messages": [user([{"type": "document", "source": {}}])]},
        "messages[0].content[0].type",
    ),
    ({"messages": [user("Hi"), {"role": "assistant", "content": "Hel"}]}, "messages[1]"),
]


@pytest.mark.parametrize(("fields", "param"), REFUSED, ids=[param for _, param in REFUSED])
async def test_each_refusal_names_its_field_in_anthropics_envelope_with_nothing_stored(
    fields: dict[str, Any], param: str
) -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await sdk(front)
        body = {k: v for k, v in call_body(**fields).items() if v is not None}
        # Sent as it is, with the SDK's headers; answered with its exceptions.
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.post(MESSAGES, body=body, cast_to=anthropic.types.Message)
        refused = caught.value
        document = refused.response.json()
        assert set(document) == {"type", "error"}, document
        assert document["type"] == "error"
        error = document["error"]
        assert error["param"] is not None, error
        assert error["param"].startswith(param), error
        assert error["type"] == "invalid_request_error"
        assert error["message"]
        # Nothing held: the SDK may retry on its own.
        assert refused.response.headers.get("x-should-retry") != "false"
        assert await stored(front) == 0
        assert await front.queued() == 0


async def test_a_beta_flag_that_turns_on_what_is_not_offered_is_refused_by_name() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await sdk(front)
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                **call_body(),
                extra_headers={"anthropic-beta": "claude-code-20250219,files-api-2025-04-14"},
            )
        error = caught.value.body["error"]  # type: ignore[index]
        assert error["param"] == "anthropic-beta"
        assert "files-api-2025-04-14" in error["message"]
        assert await stored(front) == 0


async def test_claude_codes_headers_and_query_are_taken() -> None:
    """Claude Code's beta flags and ``?beta=true`` change nothing."""
    async with open_front() as front:
        worker = await front.worker("w1")
        headers = {
            "x-api-key": front.env.requester,
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
            "context-management-2025-06-27,effort-2025-11-24",
            "x-app": "cli",
            **VERSION,
        }
        answer = await beside(
            worker.serve_one,
            front.http.post(MESSAGES, params={"beta": "true"}, headers=headers, json=call_body()),
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["content"][0]["text"] == "reply to: Name one colour."


async def test_an_effort_needs_a_worker_declaring_it_unless_best_effort_by_header() -> None:
    """No worker declares reasoning_effort: Claude Code's effort is refused
    at the first status read (404, the request cancelled, as on the chat
    route), and served with X-Horde-Options best_effort, which says the
    effort was not sent."""
    async with open_front() as front:
        worker = await front.worker("w1")
        client = await sdk(front)
        effort = {"extra_body": {"output_config": {"effort": "high"}}}
        with pytest.raises(anthropic.NotFoundError) as caught:
            await client.messages.create(**call_body(), **effort)
        refused = caught.value.response
        assert refused.json()["error"]["code"] == "no_worker_supports_features"
        assert refused.headers["x-should-retry"] == "false"
        assert await front.queued() == 0
        assert (await front.env.status(refused.json()["request_id"]))["done"] is True
        message = await beside(
            worker.serve_one,
            client.messages.create(
                **call_body(),
                **effort,
                extra_headers={"X-Horde-Options": json.dumps({"conformance": "best_effort"})},
            ),
        )
        adjustments = message.model_extra["x_horde"]["context_adjustments"]  # type: ignore[index]
        assert {"field": "effort", "requested": "high", "applied": None} == {
            k: adjustments[0][k] for k in ("field", "requested", "applied")
        }


async def test_a_bad_horde_options_header_is_refused_naming_it() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await sdk(front)
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                **call_body(), extra_headers={"X-Horde-Options": "not json"}
            )
        assert caught.value.body["error"]["param"] == "X-Horde-Options"  # type: ignore[index]
        assert await stored(front) == 0


async def test_a_wrong_method_or_unknown_path_under_messages_is_in_anthropics_envelope() -> None:
    async with open_front() as front:
        wrong = await front.http.get(MESSAGES, headers=VERSION)
        unknown = await front.http.post(MESSAGES + "/batches", headers=VERSION, json={})
    assert wrong.status_code == 405
    assert wrong.json()["type"] == "error"
    assert wrong.json()["error"]["code"] == "MethodNotAllowed"
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {
        "type": "not_found_error",
        "message": unknown.json()["error"]["message"],
        "code": "NotFound",
        "param": None,
    }


async def test_a_body_that_is_not_json_is_400_in_anthropics_envelope() -> None:
    async with open_front() as front:
        answer = await front.http.post(
            MESSAGES,
            headers={"x-api-key": front.env.requester, "content-type": "application/json"},
            content=b"{not json",
        )
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert await stored(front) == 0


# Leaving ------------------------------------------------------------------------------


async def test_a_client_that_leaves_mid_call_gets_its_request_cancelled_and_not_charged() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        kudos = await front.env.kudos()
        async with httpx.AsyncClient(base_url=front.url, verify=TLS) as leaving:

            async def call(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                task_status.started()
                await leaving.post(
                    MESSAGES,
                    headers={"x-api-key": front.env.requester, **VERSION},
                    json=call_body(),
                )

            await front.leave_once_queued(call)
        await pop_nothing(worker)
        assert await front.env.kudos() == kudos


async def test_a_client_that_leaves_a_waiting_stream_gets_its_request_cancelled() -> None:
    async with open_front({"keepalive_interval": 0.1}) as front:
        worker = await front.worker("w1")
        kudos = await front.env.kudos()
        headers = {"x-api-key": front.env.requester, **VERSION}

        async def leave_after_the_headers(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            body = call_body(stream=True)
            async with front.http.stream("POST", MESSAGES, headers=headers, json=body) as answer:
                assert answer.status_code == 200
                task_status.started()
                await anyio.sleep_forever()

        # The client goes away while its stream waits for a worker.
        await front.leave_once_queued(leave_after_the_headers)
        await pop_nothing(worker)
        assert await front.env.kudos() == kudos


# The models list and the root ----------------------------------------------------------


async def test_the_models_list_is_anthropics_with_anthropic_version_and_openais_without() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await sdk(front)
        listed = [model async for model in client.models.list()]
        assert [model.id for model in listed] == [MODEL]
        assert listed[0].type == "model"
        assert listed[0].to_dict()["max_tokens"] == 1024
        one = await client.models.retrieve(MODEL)
        assert one.id == MODEL
        with pytest.raises(anthropic.NotFoundError):
            await client.models.retrieve("no-such-model")
        with pytest.raises(anthropic.NotFoundError):
            await client.models.list(after_id="no-such-model")
        openai_list = (await front.http.get("/v1/models")).json()
        assert openai_list["object"] == "list"
        assert [(m["id"], m["object"]) for m in openai_list["data"]] == [(MODEL, "model")]
        assert (await front.http.get(f"/v1/models/{MODEL}")).json()["object"] == "model"
        refused = await front.http.get("/v1/models", params={"limit": "0"}, headers=VERSION)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "limit"


@pytest.mark.parametrize("dashboard", [False, True], ids=["dashboard-off", "dashboard-on"])
async def test_head_of_the_root_answers_200(dashboard: bool) -> None:
    config = Config().replace(dashboard={"enabled": dashboard})
    async with (
        open_horde(config=config) as horde,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        probed = await client.head("/")
        got = await client.get("/")
    assert probed.status_code == 200
    assert probed.content == b""
    # Without the page, the root answers nothing but the probe.
    assert got.status_code == (200 if dashboard else 405)
