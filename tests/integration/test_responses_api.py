"""OpenAI's Responses API served by a horde (decision 0078), driven by
the official ``openai`` package and the OpenAI Agents SDK over real HTTP, a
fake chat worker answering.

``POST /v1/responses`` is the chat route's call (the same ``serve``), so
what these tests check is the API's own: the Response object, the event
stream, function calls both ways, structured output, stored Responses read
back, deleted and continued by ``previous_response_id``, and each refusal by
its Responses field with nothing queued.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import agents
import anyio
import openai
import pydantic
import pytest
from sqlalchemy import select

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.storage.schema import requests
from tests.integration._chat_helpers import MODEL, STRICT
from tests.integration.test_front import Front, open_front

pytestmark = pytest.mark.anyio

RESPONSES = "/v1/responses"
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def text_reply(content: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}


def call_reply() -> dict[str, Any]:
    return {
        "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
        "finish_reason": "tool_calls",
    }


async def beside(serve: Callable[[], Awaitable[object]], call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``'s result, made while ``serve()`` (the worker's side) runs beside it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        return await call()


def sent_messages(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """(role, content) of each message a worker's job carries; an
    assistant's tool calls for its content when it makes some."""
    out = []
    for message in job["payload"]["messages"]:
        content = message.get("tool_calls") or message.get("content")
        out.append((message["role"], content))
    return out


async def assert_nothing_queued(front: Front) -> None:
    assert await front.queued() == 0
    assert await request_ids(front) == []


async def request_ids(front: Front) -> list[str]:
    """The ids of every request the horde holds, from its database."""
    return await front.env.horde.horde.db.read(
        lambda conn: list(conn.execute(select(requests.c.id)).scalars())
    )


# responses.create ------------------------------------------------------------------


async def test_a_plain_response_is_the_workers_reply_as_output_text_with_usage_and_x_horde() -> (
    None
):
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return text_reply("Blue.")

    async with open_front() as front:
        worker = await front.worker("w1", reply=reply)
        client = await front.sdk()
        answer = await beside(
            worker.serve_one,
            lambda: client.responses.create(
                model=MODEL,
                instructions="Answer in one word.",
                input="Name one colour.",
                max_output_tokens=64,
            ),
        )
        x_horde = answer.model_extra["x_horde"]  # type: ignore[index]
        request_id = x_horde["request_id"]
        assert answer.id == f"resp_{request_id}"
        assert answer.object == "response"
        assert answer.status == "completed"
        assert answer.model == MODEL
        assert answer.output_text == "Blue."
        assert [item.type for item in answer.output] == ["message"]
        assert answer.instructions == "Answer in one word."
        assert answer.max_output_tokens == 64
        assert answer.usage is not None
        assert answer.usage.output_tokens > 0
        assert answer.usage.total_tokens == answer.usage.input_tokens + answer.usage.output_tokens
        assert x_horde["worker"]["name"] == "w1"
        status = await front.env.status(request_id)
        assert status["done"] is True
        assert x_horde["kudos"] == status["kudos"]
        # The worker got a chat job: the instructions as the system message.
        assert sent_messages(jobs[0]) == [
            ("system", "Answer in one word."),
            ("user", "Name one colour."),
        ]
        assert jobs[0]["payload"]["max_length"] == 64


async def test_a_streamed_response_sends_the_events_in_order_numbered_and_ends_completed() -> None:
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: text_reply("Blue."))
        client = await front.sdk()

        async def read() -> list[Any]:
            stream = await client.responses.create(
                model=MODEL, input="Name one colour.", max_output_tokens=64, stream=True
            )
            return [event async for event in stream]

        events = await beside(worker.serve_one, read)
        kinds = [event.type for event in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        body = [k for k in kinds[2:-1] if k != "response.in_progress"]  # keep-alives apart
        assert body[:2] == ["response.output_item.added", "response.content_part.added"]
        assert body[-3:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        assert set(body[2:-3]) == {"response.output_text.delta"}
        assert [event.sequence_number for event in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == "Blue."
        final = events[-1].response
        assert final.status == "completed"
        assert final.output_text == "Blue."
        # The stream's items are the Response's, under the same ids.
        added = events[2].item
        assert added.id == final.output[0].id
        # The stored Response is the one the stream ended with.
        again = await client.responses.retrieve(final.id)
        assert again.output == final.output
        assert again.status == "completed"


async def test_a_streamed_function_call_waits_with_in_progress_events_after_the_opening() -> None:
    """A call with tools is served from the finished reply: the Response is
    created at once, response.in_progress repeats while it waits, and the
    numbers run on without a gap."""
    async with open_front({"keepalive_interval": 0.05}) as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=lambda job: call_reply())
        client = await front.sdk()
        waited = anyio.Event()
        events: list[Any] = []

        async def read() -> None:
            stream = await client.responses.create(
                model=MODEL, input="Weather in Paris?", tools=[WEATHER], stream=True
            )
            async for event in stream:
                events.append(event)
                if [e.type for e in events].count("response.in_progress") >= 3:
                    waited.set()

        async def serve() -> None:
            await waited.wait()  # the worker answers once the call has waited
            await worker.serve_one()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            await read()
        kinds = [event.type for event in events]
        assert kinds[:3] == ["response.created", "response.in_progress", "response.in_progress"]
        rest = [k for k in kinds if k != "response.in_progress"][1:]
        assert rest == [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert [event.sequence_number for event in events] == list(range(len(events)))
        (call,) = events[-1].response.output
        assert call.type == "function_call"
        assert call.call_id == "call_1"
        assert json.loads(call.arguments) == {"city": "Paris"}


async def test_a_function_call_and_its_output_round_trip() -> None:
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return call_reply() if len(jobs) == 1 else text_reply("Take no umbrella.")

    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=reply)
        client = await front.sdk()
        question = {"role": "user", "content": "What is the weather in Paris?"}
        first = await beside(
            worker.serve_one,
            lambda: client.responses.create(model=MODEL, input=[question], tools=[WEATHER]),
        )
        (call,) = first.output
        assert call.type == "function_call"
        assert call.call_id == "call_1"
        assert call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert call.status == "completed"
        assert first.status == "completed"
        assert first.tools[0].name == "get_weather"  # type: ignore[union-attr]

        # The SDK's usual loop: the call item as returned, then its output.
        follow_up = [
            question,
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"},
        ]
        second = await beside(
            worker.serve_one,
            lambda: client.responses.create(model=MODEL, input=follow_up, tools=[WEATHER]),
        )
        assert second.output_text == "Take no umbrella."
        assert sent_messages(jobs[1]) == [
            ("user", "What is the weather in Paris?"),
            ("assistant", [CALL]),
            ("tool", "18 C and sunny"),
        ]
        assert jobs[1]["payload"]["messages"][2]["tool_call_id"] == "call_1"


class Colour(pydantic.BaseModel):
    name: str
    hex: str


async def test_a_json_schema_text_format_reply_reaches_the_sdk_parsed() -> None:
    content = '{"name": "blue", "hex": "#0000ff"}'
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return text_reply(content)

    async with open_front() as front:
        features = ("json_schema", "structured_output_enforced", *STRICT)
        worker = await front.worker("w1", features, reply=reply)
        client = await front.sdk()
        # parse() sends the model as a strict json_schema text.format.
        answer = await beside(
            worker.serve_one,
            lambda: client.responses.parse(
                model=MODEL, input="Name one colour with its hex code.", text_format=Colour
            ),
        )
        assert answer.output_text == content
        assert answer.output_parsed == Colour(name="blue", hex="#0000ff")
        response_format = jobs[0]["payload"]["response_format"]
        assert response_format["type"] == "json_schema"
        assert response_format["json_schema"]["name"] == "Colour"
        assert response_format["json_schema"]["strict"] is True
        assert answer.text.format.type == "json_schema"  # type: ignore[union-attr]


# Stored Responses --------------------------------------------------------------------


async def test_a_stored_response_is_retrieved_and_deleted_by_its_key_only() -> None:
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: text_reply("Blue."))
        client = await front.sdk()
        stranger = await front.sdk(api_key=front.env.owner)
        made = await beside(
            worker.serve_one,
            lambda: client.responses.create(model=MODEL, input="Name one colour."),
        )
        read = await client.responses.retrieve(made.id)
        assert read.id == made.id
        assert read.status == "completed"
        assert read.output == made.output
        assert read.usage == made.usage
        assert read.created_at == made.created_at

        # Another key sees no such response, and cannot delete it.
        for attempt in (stranger.responses.retrieve, stranger.responses.delete):
            with pytest.raises(openai.NotFoundError) as caught:
                await attempt(made.id)
            error = caught.value.response.json()["error"]
            assert error["code"] == "response_not_found"
            assert error["param"] == "response_id"
        assert (await client.responses.retrieve(made.id)).status == "completed"

        await client.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(made.id)


async def test_a_response_not_stored_is_not_retrievable() -> None:
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: text_reply("Blue."))
        client = await front.sdk()
        made = await beside(
            worker.serve_one,
            lambda: client.responses.create(model=MODEL, input="Name one colour.", store=False),
        )
        assert made.store is False
        assert made.output_text == "Blue."
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(made.id)


async def test_a_waiting_response_reads_back_queued_and_its_delete_cancels_it() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk()
        made: list[Any] = []

        async def create() -> None:
            with pytest.raises(openai.APIStatusError) as caught:
                await client.responses.create(model=MODEL, input="Name one colour.")
            made.append(caught.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(create)
            await front.until_queued(1)
            (request_id,) = await request_ids(front)
            response_id = f"resp_{request_id}"
            read = await client.responses.retrieve(response_id)
            assert read.status == "queued"
            assert read.output == []
            await client.responses.delete(response_id)
        await front.assert_cancelled(request_id)
        # The call waiting on it ends without a reply, and is charged nothing.
        assert made[0].status_code == 502
        assert (await front.env.status(request_id))["kudos"] == 0


async def test_previous_response_id_puts_its_conversation_and_reply_before_the_new_input() -> None:
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return call_reply() if len(jobs) == 1 else text_reply("Take no umbrella.")

    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=reply)
        client = await front.sdk()
        first = await beside(
            worker.serve_one,
            lambda: client.responses.create(
                model=MODEL,
                instructions="Be brief.",
                input="What is the weather in Paris?",
                tools=[WEATHER],
            ),
        )
        output = {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"}
        second = await beside(
            worker.serve_one,
            lambda: client.responses.create(
                model=MODEL,
                instructions="Answer as a poet.",
                previous_response_id=first.id,
                input=[output],
                tools=[WEATHER],
            ),
        )
        assert second.output_text == "Take no umbrella."
        assert second.previous_response_id == first.id
        # Its own instructions, then the first's conversation without its
        # instructions and the first's reply (its call), then the new input.
        assert sent_messages(jobs[1]) == [
            ("system", "Answer as a poet."),
            ("user", "What is the weather in Paris?"),
            ("assistant", [CALL]),
            ("tool", "18 C and sunny"),
        ]
        # A chain goes on: the third call carries both turns before it.
        third = await beside(
            worker.serve_one,
            lambda: client.responses.create(
                model=MODEL, previous_response_id=second.id, input="And tomorrow?", tools=[WEATHER]
            ),
        )
        assert third.status == "completed"
        assert sent_messages(jobs[2])[1:] == [
            ("assistant", [CALL]),
            ("tool", "18 C and sunny"),
            ("assistant", "Take no umbrella."),
            ("user", "And tomorrow?"),
        ]


# Refusals ------------------------------------------------------------------------------


REFUSALS = [
    # (the call's arguments beyond model and input, the param, the code, the status)
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "UnsupportedChatParameter", 400),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type", "UnsupportedChatParameter", 400),
    ({"background": True}, "background", "UnsupportedChatParameter", 400),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "UnsupportedChatParameter", 400),
    ({"include": ["message.output_text.logprobs"]}, "include[0]", "UnsupportedChatParameter", 400),
    ({"max_output_tokens": 0}, "max_output_tokens", "BadRequest", 400),
    (
        {"extra_body": {"conversation": "conv_1"}},
        "conversation",
        "UnsupportedChatParameter",
        400,
    ),
    (
        {"previous_response_id": "resp_00000000-0000-4000-8000-000000000000"},
        "previous_response_id",
        "previous_response_not_found",
        400,
    ),
    (
        {"previous_response_id": "not-a-response"},
        "previous_response_id",
        "previous_response_not_found",
        400,
    ),
]


@pytest.mark.parametrize(("fields", "param", "code", "status"), REFUSALS)
async def test_a_refusal_names_its_responses_field_in_openais_envelope_with_nothing_queued(
    fields: dict[str, Any], param: str, code: str, status: int
) -> None:
    async with open_front() as front:
        await front.worker("w1", ALL_NAMES)
        client = await front.sdk(max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.responses.create(model=MODEL, input="Name one colour.", **fields)
        assert caught.value.status_code == status
        error = caught.value.response.json()["error"]
        assert error["param"] == param, error
        assert error["code"] == code, error
        assert error["message"], error
        assert caught.value.response.headers.get("x-should-retry") != "false"
        await assert_nothing_queued(front)


async def test_another_keys_response_cannot_be_continued() -> None:
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: text_reply("Blue."))
        client = await front.sdk()
        stranger = await front.sdk(api_key=front.env.owner)
        made = await beside(
            worker.serve_one,
            lambda: client.responses.create(model=MODEL, input="Name one colour."),
        )
        with pytest.raises(openai.BadRequestError) as caught:
            await stranger.responses.create(
                model=MODEL, input="Another one.", previous_response_id=made.id
            )
        error = caught.value.response.json()["error"]
        assert error["code"] == "previous_response_not_found"
        assert error["param"] == "previous_response_id"
        assert await front.queued() == 0


async def test_a_malformed_response_id_is_404_in_openais_envelope() -> None:
    async with open_front() as front:
        client = await front.sdk(max_retries=0)
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.retrieve("resp_nothing")
        assert caught.value.response.json()["error"]["code"] == "response_not_found"


# The OpenAI Agents SDK -----------------------------------------------------------------


# The Agents SDK runs its tools and turns on asyncio's own primitives
# (asyncio.create_task): it cannot run under trio.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_agents_sdk_runner_calls_its_function_tool_and_answers_with_its_result() -> None:
    agents.set_tracing_disabled(True)
    jobs: list[dict[str, Any]] = []
    cities: list[str] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return call_reply() if len(jobs) == 1 else text_reply("Take no umbrella.")

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "18 C and sunny"

    async with open_front() as front:
        worker = await front.worker("w1", ALL_NAMES, reply=reply)
        client = await front.sdk()
        agent = agents.Agent(
            name="forecaster",
            instructions="Answer with the weather.",
            tools=[get_weather],
            model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        )

        async def serve_two() -> None:
            await worker.serve_one()
            await worker.serve_one()

        result = await beside(
            serve_two, lambda: agents.Runner.run(agent, "What is the weather in Paris?")
        )
        assert result.final_output == "Take no umbrella."
        assert cities == ["Paris"]
        # The second turn carried the call and the tool's output to the worker.
        assert sent_messages(jobs[1]) == [
            ("system", "Answer with the weather."),
            ("user", "What is the weather in Paris?"),
            ("assistant", [CALL]),
            ("tool", "18 C and sunny"),
        ]
        assert jobs[0]["payload"]["tools"][0]["function"]["name"] == "get_weather"
