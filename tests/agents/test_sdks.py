"""The openai, openai-agents and anthropic packages against a real horde.

The same set-up as the coding agents' tests (tests/agents/test_clients.py):
a ``hordelite serve`` subprocess and a ``hordelite worker`` subprocess in
front of the fake backend, run here so that the test reads what it was
sent, started once for the module. Each test calls the route as the SDK's
users do and asserts that the answer is the worker's: the fake backend's
``echo: <last user text>``, or the tool call it makes when the last user
text says ``call <name>`` (hordelite/worker/fake_backend.py). These need no
binary: they run wherever the suite runs.
"""

from __future__ import annotations

import json
from typing import Any

import agents
import anthropic
import httpx
import openai
import pytest

from tests.agents.test_clients import MODEL, Horde, answer_to, horde, tool_messages

__all__ = ["horde"]  # the module-scoped serve, worker and fake backend

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # The Agents SDK runs its turns on asyncio's own primitives; the horde
    # is a subprocess, so the loop of this process changes nothing it sees.
    return "asyncio"


def openai_client(horde: Horde) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{horde.url}/v1", api_key=horde.key, max_retries=0)


def anthropic_client(horde: Horde) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=horde.url, api_key=horde.key, max_retries=0)


def new_chats(horde: Horde, before: int) -> list[dict[str, Any]]:
    return horde.chats()[before:]


# The OpenAI Responses API --------------------------------------------------------


async def test_responses_create_answers_with_the_workers_text(horde: Horde) -> None:
    before = len(horde.chats())
    async with openai_client(horde) as client:
        response = await client.responses.create(model=MODEL, input="Say hello")
    [chat] = new_chats(horde, before)
    assert response.status == "completed"
    assert response.output_text == answer_to(chat) == "echo: Say hello"


async def test_a_streamed_response_ends_completed_with_the_workers_text(horde: Horde) -> None:
    async with openai_client(horde) as client:
        stream = await client.responses.create(model=MODEL, input="Say hello", stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "echo: Say hello"


async def test_a_function_call_round_trip_through_the_responses_api(horde: Horde) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}
    prompt = "call get_weather for Paris"
    before = len(horde.chats())
    async with openai_client(horde) as client:
        first = await client.responses.create(model=MODEL, input=prompt, tools=[tool])
        [call] = [item for item in first.output if item.type == "function_call"]
        assert call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
        second = await client.responses.create(
            model=MODEL,
            tools=[tool],
            input=[
                {"role": "user", "content": prompt},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
            ],
        )
    asked, answered = new_chats(horde, before)
    assert [t["function"]["name"] for t in asked["tools"]] == ["get_weather"]
    assert tool_messages(answered) == ["18 C"]
    assert second.output_text == f"echo: {prompt}"


async def test_an_agents_runner_calls_its_function_tool_and_answers(horde: Horde) -> None:
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "18 C and sunny"

    prompt = "call get_weather, then tell me"
    before = len(horde.chats())
    async with openai_client(horde) as client:
        agent = agents.Agent(
            name="forecaster",
            instructions="Answer with the weather.",
            tools=[get_weather],
            model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        )
        result = await agents.Runner.run(agent, prompt)
    asked, answered = new_chats(horde, before)
    assert len(cities) == 1  # the tool ran once, with the worker's arguments
    assert "get_weather" in [t["function"]["name"] for t in asked["tools"]]
    assert tool_messages(answered) == ["18 C and sunny"]
    assert result.final_output == f"echo: {prompt}"


# Anthropic's Messages API --------------------------------------------------------


async def test_messages_create_answers_with_the_workers_text(horde: Horde) -> None:
    async with anthropic_client(horde) as client:
        message = await client.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Say hello"}]
        )
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "echo: Say hello"  # type: ignore[union-attr]


async def test_a_streamed_message_gives_the_workers_text(horde: Horde) -> None:
    async with anthropic_client(horde) as client:
        async with client.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Say hello"}]
        ) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
    assert text == "echo: Say hello"
    assert final.stop_reason == "end_turn"


async def test_a_tool_use_round_trip_through_the_messages_api(horde: Horde) -> None:
    tool = {"name": "get_weather", "description": "The weather.", "input_schema": WEATHER}
    prompt = "call get_weather for Paris"
    async with anthropic_client(horde) as client:
        first = await client.messages.create(
            model=MODEL,
            max_tokens=64,
            tools=[tool],  # type: ignore[list-item]
            messages=[{"role": "user", "content": prompt}],
        )
        assert first.stop_reason == "tool_use"
        [use] = [block for block in first.content if block.type == "tool_use"]
        assert use.name == "get_weather"
        second = await client.messages.create(
            model=MODEL,
            max_tokens=64,
            tools=[tool],  # type: ignore[list-item]
            messages=[
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[list-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}],
                },
            ],
        )
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == f"echo: {prompt}"  # type: ignore[union-attr]


async def test_count_tokens_queues_nothing_and_counts(horde: Horde) -> None:
    before = len(horde.chats())
    async with anthropic_client(horde) as client:
        counted = await client.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Say hello"}]
        )
    assert counted.input_tokens > 0
    assert new_chats(horde, before) == []


async def test_a_refusal_reaches_the_anthropic_sdk_as_its_own_error(horde: Horde) -> None:
    async with anthropic_client(horde) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "hi"}]
            )
    assert refused.value.body["error"]["param"] == "max_tokens"  # type: ignore[index]


async def test_the_horde_answers_head_on_its_root(horde: Horde) -> None:
    async with httpx.AsyncClient(base_url=horde.url) as client:
        assert (await client.head("/")).status_code == 200
