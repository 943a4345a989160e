"""The Responses API's answers (front/_responses.py): the Response object
and every stream event, validated with the ``openai`` package's own types,
and the streams read back by the SDK's stream accumulator over a fake
transport (the bytes the encoder makes, served as an HTTP answer)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.responses_request import ResponsesEcho, parse_responses_request
from hordelite.errors import RC, HordeError
from hordelite.front._responses import (
    ResponseContext,
    ResponsesEncoder,
    ended_response,
    response,
)
from hordelite.horde.results import Generation, RequestStatus
from tests.chat_shapes import string_object
from tests.unit.test_responses_request import RICH_BODY, WEATHER

RESPONSE: pydantic.TypeAdapter[Response] = pydantic.TypeAdapter(Response)
EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
REQUEST_ID = str(uuid.UUID(int=38))
MODEL = "fake-model"
PROMPT_CHARS = 40
DOCS = {
    "type": "namespace",
    "name": "mcp__docs__",
    "description": "Docs.",
    "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
}
DOCS_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "responses_api.md"


def echo_of(**fields: Any) -> ResponsesEcho:
    return parse_responses_request({"model": MODEL, "input": "Hi", **fields}).echo


def context(echo: ResponsesEcho | None = None) -> ResponseContext:
    return ResponseContext(echo or echo_of(), REQUEST_ID, PROMPT_CHARS)


def reply(
    content: str | None = "Hello!",
    *,
    reasoning: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    counts: tuple[int | None, int | None, int | None] = (None, None, None),
) -> ChatReply:
    return ChatReply(content, calls, reasoning, finish, None, *counts)


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def status(answer: ChatReply) -> RequestStatus:
    generation = Generation(
        "w-1",
        "worker one",
        MODEL,
        "ok",
        id="job-1",
        reply=answer,
        kudos=2.0,
        charge_basis="counted",
    )
    return RequestStatus("chat", 1, 0, 0, 0, True, False, 0, 0, 2.0, True, (generation,))


def answer(
    answered: ChatReply, echo: ResponsesEcho | None = None, include_reasoning: bool = True
) -> dict[str, Any]:
    """The Response, checked against the SDK's type."""
    data = response(context(echo), status(answered), include_reasoning)
    RESPONSE.validate_python(data)
    return data


def streamed(
    answered: ChatReply, echo: ResponsesEcho | None = None, include_reasoning: bool = True
) -> bytes:
    """The stream of a finished reply, as a relay hands it over: the
    reasoning, then the content in two pieces, then the end."""
    encoder = ResponsesEncoder(context(echo), MODEL)
    raw = b"".join(encoder.opening())
    if include_reasoning and answered.reasoning_content:
        raw += b"".join(encoder.delta("reasoning_content", answered.reasoning_content))
    content = answered.content or ""
    for piece in (content[:3], content[3:]):
        raw += b"".join(encoder.delta("content", piece))
    return raw + b"".join(encoder.closing(status(answered)))


def events(raw: bytes) -> list[dict[str, Any]]:
    """The events of a stream, each checked: ``event:`` names its type, the
    SDK's event type validates it, sequence numbers count from 0."""
    found = []
    for block in raw.decode().split("\n\n")[:-1]:
        if block.startswith(":"):
            continue
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        assert type(EVENT.validate_python(event)).__name__.startswith("Response")
        found.append(event)
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    return found


def kinds(found: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in found]


OPENING = ["created", "in_progress"]


def text_item(kind: str, deltas: int) -> list[str]:
    """The events of a text item (``kind`` output_text or reasoning_text)
    streamed in ``deltas`` deltas."""
    middle = [f"{kind}.delta"] * deltas
    added = ["output_item.added", "content_part.added"]
    return [*added, *middle, f"{kind}.done", "content_part.done", "output_item.done"]


def call_item(arguments: bool) -> list[str]:
    delta = ["function_call_arguments.delta"] if arguments else []
    done = ["function_call_arguments.done", "output_item.done"]
    return ["output_item.added", *delta, *done]


# The Response -------------------------------------------------------------------------


def test_a_plain_reply_is_a_completed_response_with_one_message() -> None:
    echo = echo_of(instructions="Be brief.", metadata={"team": "a"}, store=False)
    data = answer(reply("Hello!"), echo)
    assert data["id"] == f"resp_{REQUEST_ID}"
    assert (data["object"], data["status"], data["model"]) == ("response", "completed", MODEL)
    assert data["output"] == [
        {
            "type": "message",
            "id": f"msg_{REQUEST_ID}_0",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert RESPONSE.validate_python(data).output_text == "Hello!"
    assert (data["error"], data["incomplete_details"]) == (None, None)
    assert data["completed_at"] >= data["created_at"]
    assert (data["instructions"], data["metadata"], data["store"]) == (
        "Be brief.",
        {"team": "a"},
        False,
    )
    assert (data["tool_choice"], data["tools"], data["parallel_tool_calls"]) == ("auto", [], True)
    assert data["text"] == {"format": {"type": "text"}}
    # Usage estimated from the text (4 characters a token), as on the chat route.
    assert data["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    }
    assert data["x_horde"] == {
        "request_id": REQUEST_ID,
        "kudos": 2.0,
        "charge_basis": "counted",
        "worker": {"id": "w-1", "name": "worker one"},
        "model": MODEL,
        "estimated_usage": True,
    }


def test_reasoning_a_message_and_calls_are_output_items_in_that_order() -> None:
    echo = echo_of(tools=[WEATHER, DOCS])
    calls = [
        call("call_1", "get_weather", '{"city":"Oslo"}'),
        call("call_2", "mcp__docs__search", "{}"),
    ]
    data = answer(reply("Checking.", reasoning="Two calls.", calls=calls, counts=(7, 9, 3)), echo)
    assert [item["type"] for item in data["output"]] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert data["output"][0] == {
        "type": "reasoning",
        "id": f"rs_{REQUEST_ID}_0",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Two calls."}],
        "encrypted_content": None,
        "status": "completed",
    }
    assert data["output"][2:] == [
        {
            "type": "function_call",
            "id": f"fc_{REQUEST_ID}_2",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
            "status": "completed",
        },
        {
            "type": "function_call",
            "id": f"fc_{REQUEST_ID}_3",
            "call_id": "call_2",
            "name": "search",
            "namespace": "mcp__docs__",
            "arguments": "{}",
            "status": "completed",
        },
    ]
    assert data["usage"]["input_tokens"] == 7
    assert data["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert data["x_horde"]["estimated_usage"] is False


def test_calls_without_content_have_no_message_and_reasoning_can_be_left_out() -> None:
    calls = [call("call_1", "get_weather", "{}")]
    data = answer(
        reply(None, reasoning="Hm.", calls=calls, finish="tool_calls"), echo_of(tools=[WEATHER])
    )
    assert [item["type"] for item in data["output"]] == ["reasoning", "function_call"]
    hidden = answer(reply("Hi", reasoning="Hm."), include_reasoning=False)
    assert [item["type"] for item in hidden["output"]] == ["message"]
    empty = answer(reply(None))
    assert empty["output"][0]["content"][0]["text"] == ""


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_reply_cut_short_is_incomplete(finish: str, reason: str) -> None:
    data = answer(reply("Hel", finish=finish), echo_of(max_output_tokens=1))
    assert (data["status"], data["incomplete_details"]) == ("incomplete", {"reason": reason})
    assert data["output"][0]["status"] == "incomplete"
    assert "completed_at" not in data
    assert data["max_output_tokens"] == 1


def test_dropped_tools_are_listed_in_x_horde() -> None:
    echo = echo_of(tools=[{"type": "web_search"}, WEATHER], horde={"conformance": "best_effort"})
    data = answer(reply("Hi"), echo)
    assert data["x_horde"]["dropped_tools"] == [{"param": "tools[0]", "type": "web_search"}]
    assert [tool["name"] for tool in data["tools"]] == ["get_weather"]


def test_the_echo_of_every_field_validates() -> None:
    echo = parse_responses_request(RICH_BODY).echo
    data = answer(reply('{"a":"b"}'), echo)
    parsed = RESPONSE.validate_python(data)
    assert parsed.tools[1].type == "namespace"
    assert (parsed.truncation, parsed.service_tier, parsed.previous_response_id) == (
        "auto",
        "default",
        "resp_1",
    )
    assert parsed.reasoning is not None
    assert parsed.reasoning.effort == "low"
    assert data["x_horde"]["dropped_tools"] == [{"param": "tools[2]", "type": "web_search"}]


@pytest.mark.parametrize(
    ("state", "exc", "code"),
    [
        ("failed", HordeError(RC.ChatRequestFaulted, worker_rc="ChatWorkerFault"), "server_error"),
        ("failed", HordeError(RC.TooManyPrompts), "rate_limit_exceeded"),
        ("cancelled", None, None),
        ("queued", None, None),
        ("in_progress", None, None),
    ],
)
def test_a_request_with_no_reply_reads_back_in_its_state(
    state: str, exc: HordeError | None, code: str | None
) -> None:
    data = ended_response(context(), MODEL, state, exc)
    RESPONSE.validate_python(data)
    assert (data["status"], data["output"], data["usage"]) == (state, [], None)
    if exc is None:
        assert data["error"] is None
        assert data["x_horde"] == {"request_id": REQUEST_ID}
    else:
        assert data["error"] == {"code": code, "message": exc.message}
        assert data["x_horde"]["rc"] == exc.rc.name
    if state == "failed" and code == "server_error":
        assert data["x_horde"]["worker_rc"] == "ChatWorkerFault"


# The stream ------------------------------------------------------------------------------


def test_a_plain_stream_is_the_documented_sequence() -> None:
    found = events(streamed(reply("Hello!")))
    assert kinds(found) == [*OPENING, *text_item("output_text", 2), "completed"]
    assert found[0]["response"]["status"] == found[1]["response"]["status"] == "in_progress"
    assert [e["delta"] for e in found if e["type"] == "response.output_text.delta"] == [
        "Hel",
        "lo!",
    ]
    assert found[6]["text"] == "Hello!"
    # The final Response is the unstreamed one (the same items and ids).
    final = found[-1]["response"]
    assert final["output"] == answer(reply("Hello!"))["output"]
    assert final["usage"]["total_tokens"] == 12


def test_a_stream_with_reasoning_and_calls_closes_each_item_in_order() -> None:
    echo = echo_of(tools=[WEATHER, DOCS])
    calls = [
        call("call_1", "get_weather", '{"city":"Oslo"}'),
        call("call_2", "mcp__docs__search", ""),
    ]
    answered = reply("Checking.", reasoning="Two calls.", calls=calls, finish="tool_calls")
    found = events(streamed(answered, echo))
    assert kinds(found) == [
        *OPENING,
        *text_item("reasoning_text", 1),
        *text_item("output_text", 2),
        *call_item(arguments=True),
        *call_item(arguments=False),  # no delta for empty arguments
        "completed",
    ]
    added = [e for e in found if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["status"]) for e in added] == [
        (0, "in_progress"),
        (1, "in_progress"),
        (2, "in_progress"),
        (3, "in_progress"),
    ]
    assert added[3]["item"]["namespace"] == "mcp__docs__"
    assert found[-1]["response"]["output"] == answer(answered, echo)["output"]


def test_an_empty_reply_streams_an_empty_message_and_an_incomplete_one_ends_incomplete() -> None:
    found = events(streamed(reply(None)))
    assert kinds(found) == [*OPENING, *text_item("output_text", 0), "completed"]
    cut = events(streamed(reply("Hel", finish="length")))
    assert cut[-1]["type"] == "response.incomplete"
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut[-2]["item"]["status"] == "incomplete"


def test_reasoning_after_content_opens_an_item_of_its_own() -> None:
    encoder = ResponsesEncoder(context(), MODEL)
    raw = b"".join(encoder.opening())
    for field, text in (("content", "A"), ("reasoning_content", "hm"), ("content", "B")):
        raw += b"".join(encoder.delta(field, text))
    raw += b"".join(encoder.closing(status(reply("AB", reasoning="hm"))))
    final = events(raw)[-1]["response"]
    assert [(item["type"], item["id"]) for item in final["output"]] == [
        ("message", f"msg_{REQUEST_ID}_0"),
        ("reasoning", f"rs_{REQUEST_ID}_1"),
        ("message", f"msg_{REQUEST_ID}_2"),
    ]


def test_a_failure_ends_the_open_item_and_the_response_failed() -> None:
    encoder = ResponsesEncoder(context(), MODEL)
    raw = b"".join(encoder.opening()) + b"".join(encoder.delta("content", "Hel"))
    raw += encoder.keepalive()
    raw += b"".join(encoder.failure(HordeError(RC.RequestTimeout, "No reply within 4 s.")))
    found = events(raw)
    assert kinds(found)[-4:] == [
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "failed",
    ]
    failed = found[-1]["response"]
    assert (failed["status"], failed["error"]) == (
        "failed",
        {"code": "server_error", "message": "No reply within 4 s."},
    )
    assert failed["output"][0]["status"] == "incomplete"
    assert failed["x_horde"] == {"request_id": REQUEST_ID, "rc": "RequestTimeout"}
    # The keepalive is response.in_progress again, with the items so far.
    assert kinds(found)[2:5] == ["output_item.added", "content_part.added", "output_text.delta"]
    assert kinds(found)[5] == "in_progress"
    assert found[5]["response"]["output"] == []


def test_the_reference_lists_every_event_the_encoder_sends() -> None:
    sent: set[str] = set()
    calls = [call("c", "get_weather", "{}")]
    for answered in (reply("Hi", reasoning="Hm.", calls=calls), reply("Hi", finish="length")):
        sent |= {e["type"] for e in events(streamed(answered, echo_of(tools=[WEATHER])))}
    encoder = ResponsesEncoder(context(), MODEL)
    sent |= {
        e["type"]
        for e in events(
            b"".join([*encoder.opening(), *encoder.failure(HordeError(RC.ShuttingDown))])
        )
    }
    documented = DOCS_REFERENCE.read_text(encoding="utf-8")
    assert [kind for kind in sorted(sent) if f"`{kind}`" not in documented] == []


# The SDK reads it back ------------------------------------------------------------------------


def client_answering(raw: bytes, content_type: str) -> openai.OpenAI:
    """An OpenAI client whose every call is answered with ``raw``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=raw)

    transport = httpx.MockTransport(handler)
    return openai.OpenAI(
        api_key="k", base_url="http://horde.test/v1", http_client=httpx.Client(transport=transport)
    )


def sdk_stream(raw: bytes, **create: Any) -> tuple[list[str], Response]:
    """The SDK's stream manager over ``raw``: the events it yields, and the
    Response it accumulates."""
    client = client_answering(raw, "text/event-stream")
    with client.responses.stream(model=MODEL, input="Hi", **create) as stream:
        seen = [event.type for event in stream]
        return seen, stream.get_final_response()


def test_the_sdk_accumulates_a_streamed_reply() -> None:
    seen, final = sdk_stream(streamed(reply("Hello!", reasoning="Greet.")))
    assert final.output_text == "Hello!"
    assert final.id == f"resp_{REQUEST_ID}"
    assert "response.output_text.done" in seen
    assert seen[-1] == "response.completed"


def test_the_sdk_accumulates_a_stream_with_keepalives() -> None:
    encoder = ResponsesEncoder(context(), MODEL)
    parts = [*encoder.opening(), encoder.keepalive(), *encoder.delta("reasoning_content", "Hm.")]
    parts += [
        *encoder.delta("content", "Hel"),
        encoder.keepalive(),
        *encoder.delta("content", "lo"),
    ]
    parts += [encoder.keepalive(), *encoder.closing(status(reply("Hello", reasoning="Hm.")))]
    seen, final = sdk_stream(b"".join(parts))
    assert seen.count("response.in_progress") == 4
    assert final.output_text == "Hello"
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_the_sdk_accumulates_streamed_calls_and_parses_strict_arguments() -> None:
    calls = [
        call("call_1", "get_weather", '{"city":"Oslo"}'),
        call("call_2", "mcp__docs__search", "{}"),
    ]
    raw = streamed(reply(None, calls=calls, finish="tool_calls"), echo_of(tools=[WEATHER, DOCS]))
    _, final = sdk_stream(raw, tools=[WEATHER])
    first, second = final.output
    assert first.type == "function_call"
    assert second.type == "function_call"
    assert (first.call_id, first.arguments, first.parsed_arguments) == (
        "call_1",
        '{"city":"Oslo"}',
        {"city": "Oslo"},
    )  # type: ignore[union-attr]
    assert (second.name, second.namespace) == ("search", "mcp__docs__")


def test_the_sdk_iterates_a_raw_stream_to_its_end() -> None:
    client = client_answering(streamed(reply("Hello!")), "text/event-stream")
    stream = client.responses.create(model=MODEL, input="Hi", stream=True)
    found = list(stream)
    assert found[-1].type == "response.completed"
    assert "".join(e.delta for e in found if e.type == "response.output_text.delta") == "Hello!"


def test_the_sdk_reads_a_failed_stream() -> None:
    encoder = ResponsesEncoder(context(), MODEL)
    raw = b"".join([*encoder.opening(), *encoder.failure(HordeError(RC.ChatRequestFaulted))])
    client = client_answering(raw, "text/event-stream")
    found = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert found[-1].type == "response.failed"
    assert found[-1].response.error is not None  # type: ignore[union-attr]


def test_the_sdk_reads_the_response_and_parses_a_json_schema_reply() -> None:
    schema_format = {
        "type": "json_schema",
        "name": "colour",
        "schema": string_object(["name"], closed=True),
        "strict": True,
    }
    echo = echo_of(text={"format": schema_format})
    data = answer(reply('{"name": "teal"}'), echo)
    client = client_answering(json.dumps(data).encode(), "application/json")

    class Colour(pydantic.BaseModel):
        name: str

    parsed = client.responses.parse(model=MODEL, input="Name a colour.", text_format=Colour)
    assert parsed.output_parsed == Colour(name="teal")
    assert parsed.text is not None
    assert parsed.text.format is not None
    plain = client.responses.create(model=MODEL, input="Name a colour.")
    assert plain.usage is not None
    assert plain.usage.total_tokens == data["usage"]["total_tokens"]
