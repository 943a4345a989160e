"""The Messages API answers (front/_messages.py) and Anthropic's error
envelope (http/envelopes.py), each read by the anthropic package: its types
validate every object and event, and its client, on a transport that serves
these bytes, reads the Message, the stream and the errors as it would
Anthropic's."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import Message, ModelInfo, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.chat_request import flatten_messages, parse_chat_request
from hordelite.contract.messages_request import parse_count_tokens_request, parse_messages_request
from hordelite.errors import RC, HordeError
from hordelite.front._messages import (
    PING,
    MessageShape,
    MessageStream,
    message,
    model_entry,
    models_page,
    token_count,
)
from hordelite.horde.results import Generation, RequestStatus
from hordelite.http import envelopes

RID = "5b2c7c1e-0d7a-4c39-9d55-3c1f0d0f2a11"
EVENT = TypeAdapter(RawMessageStreamEvent)
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def reply(
    content: str | None = "Hello!",
    *,
    reasoning: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    counts: tuple[int | None, int | None, int | None] = (None, None, None),
) -> ChatReply:
    return ChatReply(content, calls, reasoning, finish, None, *counts)


def status(answer: ChatReply, adjustments: list[dict[str, Any]] | None = None) -> RequestStatus:
    generation = Generation(
        "w-1",
        "worker one",
        "m1",
        "ok",
        id="j-1",
        reply=answer,
        kudos=3.0,
        charge_basis="output_estimate",
    )
    return RequestStatus(
        "chat",
        1,
        0,
        0,
        0,
        True,
        False,
        0,
        0,
        3.0,
        True,
        (generation,),
        context_adjustments=adjustments,
    )


def shape(
    thinking: str | None = "summarized", prompt_chars: int = 40, **fields: Any
) -> MessageShape:
    return MessageShape(RID, "m1", prompt_chars, thinking, **fields)


# The Message ----------------------------------------------------------------------------


def test_a_text_reply_is_a_message() -> None:
    out = message(shape(), status(reply("Hello!", counts=(12, 3, None))))
    parsed = Message.model_validate(out)
    assert parsed.id == f"msg_{RID}"
    assert parsed.model == "m1"
    assert [block.type for block in parsed.content] == ["text"]
    assert parsed.stop_reason == "end_turn"
    assert parsed.stop_sequence is None
    assert out["usage"] == {
        "input_tokens": 12,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens_details": {"thinking_tokens": 0},
    }
    assert out["x_horde"]["request_id"] == RID
    assert out["x_horde"]["estimated_usage"] is False
    assert out["x_horde"]["worker"] == {"id": "w-1", "name": "worker one"}


def test_usage_not_reported_is_estimated_at_four_characters_a_token() -> None:
    out = message(shape(prompt_chars=41), status(reply("x" * 9, reasoning="y" * 4)))
    assert out["usage"]["input_tokens"] == 11  # 41 / 4, rounded up
    assert out["usage"]["output_tokens"] == 4  # 13 / 4
    assert out["usage"]["output_tokens_details"] == {"thinking_tokens": 1}
    assert out["x_horde"]["estimated_usage"] is True


@pytest.mark.parametrize(
    ("thinking", "blocks"),
    [
        (
            "summarized",
            [{"type": "thinking", "thinking": "Greet.", "signature": f"hordelite:{RID}"}],
        ),
        ("omitted", [{"type": "thinking", "thinking": "", "signature": f"hordelite:{RID}"}]),
        (None, []),
    ],
)
def test_reasoning_is_a_thinking_block_when_thinking_is_shown(
    thinking: str | None, blocks: list[Any]
) -> None:
    out = message(shape(thinking), status(reply("Hello!", reasoning="Greet.")))
    Message.model_validate(out)
    assert out["content"] == [*blocks, {"type": "text", "text": "Hello!"}]


def test_tool_calls_are_tool_use_blocks_with_their_input() -> None:
    blank = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": " "}}
    out = message(shape(), status(reply(None, calls=[CALL, blank], finish="tool_calls")))
    parsed = Message.model_validate(out)
    assert out["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "now", "input": {}},
    ]
    assert parsed.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("finish", "calls", "expected"),
    [
        ("stop", None, "end_turn"),
        ("length", None, "max_tokens"),
        ("content_filter", None, "refusal"),
        ("tool_calls", [CALL], "tool_use"),
        ("stop", [CALL], "tool_use"),  # a forced call finishes with stop on the chat route
    ],
)
def test_the_stop_reason(finish: str, calls: list[dict[str, Any]] | None, expected: str) -> None:
    out = message(shape(), status(reply("x", calls=calls, finish=finish)))
    assert out["stop_reason"] == expected


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"a string"'])
def test_arguments_that_are_not_an_object_are_a_worker_fault(arguments: str) -> None:
    call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
    with pytest.raises(HordeError) as caught:
        message(shape(), status(reply(None, calls=[call], finish="tool_calls")))
    assert caught.value.rc is RC.ChatWorkerFault


def test_the_adjustments_of_the_call_and_of_admission_are_in_x_horde() -> None:
    lowered = {"field": "max_tokens", "requested": 32000, "applied": 4096, "reason": "r1"}
    fitted = {"field": "max_tokens", "requested": 4096, "applied": 512, "reason": "r2"}
    out = message(shape(adjustments=(lowered,)), status(reply(), [fitted]))
    assert out["x_horde"]["context_adjustments"] == [lowered, fitted]
    assert "context_adjustments" not in message(shape(), status(reply()))["x_horde"]


# The stream ------------------------------------------------------------------------------


def stream(shaped: MessageShape, deltas: Iterable[tuple[str, str]], final: RequestStatus) -> bytes:
    encoder = MessageStream(shaped)
    out = [*encoder.opening()]
    for field, text in deltas:
        out.extend(encoder.delta(field, text))
        out.append(encoder.keepalive())
    out.extend(encoder.closing(final))
    return b"".join(out)


def events(raw: bytes) -> list[dict[str, Any]]:
    """The stream's events, each named as its type says and valid for the SDK."""
    out = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        if data["type"] not in ("ping", "error"):
            EVENT.validate_python(data)
        out.append(data)
    return out


def kinds(raw: bytes) -> list[str]:
    names = []
    for data in events(raw):
        if data["type"] == "ping":
            continue
        inner = data.get("delta", data.get("content_block", {})).get("type")
        names.append(f"{data['type']}:{inner}" if inner else data["type"])
    return names


def test_a_text_stream() -> None:
    raw = stream(shape(), [("content", "Hel"), ("content", "lo!")], status(reply("Hello!")))
    assert kinds(raw) == [
        "message_start",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_delta:text_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, *_, delta, stop = [e for e in events(raw) if e["type"] != "ping"]
    assert start["message"]["usage"]["input_tokens"] == 10
    assert start["message"]["content"] == []
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["x_horde"]["request_id"] == RID
    assert stop == {"type": "message_stop"}


def test_reasoning_streams_as_a_thinking_block_closed_by_its_signature() -> None:
    deltas = [("reasoning_content", "Gre"), ("reasoning_content", "et."), ("content", "Hello!")]
    final = status(reply("Hello!", reasoning="Greet."))
    assert kinds(stream(shape(), deltas, final)) == [
        "message_start",
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    omitted = kinds(stream(shape("omitted"), deltas, final))
    assert "content_block_delta:thinking_delta" not in omitted
    assert "content_block_delta:signature_delta" in omitted
    hidden = kinds(stream(shape(None), deltas, final))
    assert "content_block_start:thinking" not in hidden


def test_tool_calls_stream_whole_at_the_closing() -> None:
    final = status(reply("Let me look.", calls=[CALL], finish="tool_calls"))
    raw = stream(shape(), [("content", "Let me look.")], final)
    assert kinds(raw)[3:] == [
        "content_block_stop",
        "content_block_start:tool_use",
        "content_block_delta:input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    indexes = [e["index"] for e in events(raw) if "index" in e]
    assert indexes == [0, 0, 0, 1, 1, 1]


def test_a_failure_is_an_error_event() -> None:
    encoder = MessageStream(shape())
    list(encoder.opening())
    (raw,) = encoder.failure(HordeError(RC.RequestTimeout, "No reply within 4 s."))
    (data,) = events(raw)
    ErrorResponse.model_validate(data)
    assert data == {
        "type": "error",
        "error": {
            "type": "timeout_error",
            "message": "No reply within 4 s.",
            "code": "RequestTimeout",
            "param": None,
        },
        "request_id": RID,
    }


def test_the_keepalive_is_a_ping() -> None:
    assert MessageStream(shape()).keepalive() == PING
    assert events(PING) == [{"type": "ping"}]


# The anthropic client, on a transport serving these bytes ----------------------------------


def client(answer: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    transport = httpx2.MockTransport(answer)
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://horde.test",
        max_retries=0,
        http_client=httpx2.Client(transport=transport),
    )


def sse(raw: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda _: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=raw
    )


ASK: dict[str, Any] = {
    "model": "m1",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize(
    ("deltas", "final"),
    [
        ([("content", "Hel"), ("content", "lo!")], reply("Hello!")),
        (
            [("reasoning_content", "Greet."), ("content", "Hello!")],
            reply("Hello!", reasoning="Greet."),
        ),
        ([("content", "Looking.")], reply("Looking.", calls=[CALL], finish="tool_calls")),
        ([], reply(None, calls=[CALL], finish="tool_calls")),
        ([], reply("")),
    ],
)
def test_the_sdk_accumulates_the_stream_into_the_message(
    deltas: list[tuple[str, str]], final: ChatReply
) -> None:
    done = status(final)
    with client(sse(stream(shape(), deltas, done))).messages.stream(**ASK) as streamed:
        got = streamed.get_final_message()
    expected = message(shape(), done)
    assert [block.model_dump(exclude_none=True) for block in got.content] == expected["content"]
    assert (got.id, got.stop_reason) == (expected["id"], expected["stop_reason"])
    assert got.usage.model_dump(exclude_none=True) == expected["usage"]


def test_the_sdk_reads_the_message() -> None:
    body = message(shape(), status(reply("Hello!", reasoning="Greet.")))
    got = client(lambda _: httpx2.Response(200, json=body)).messages.create(**ASK)
    assert [b.type for b in got.content] == ["thinking", "text"]


def test_the_sdk_raises_on_the_error_event() -> None:
    encoder = MessageStream(shape())
    raw = b"".join(
        [
            *encoder.opening(),
            *encoder.delta("content", "Hel"),
            *encoder.failure(HordeError(RC.ChatStreamDiverged)),
        ]
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client(sse(raw)).messages.stream(**ASK) as streamed:
            streamed.get_final_message()
    assert str(caught.value).startswith("The final reply differs from the text already streamed.")
    assert f"request_id: {RID}" in str(caught.value)


# Anthropic's error envelope ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rc", "status_code", "kind", "sdk_error"),
    [
        (RC.UnsupportedChatParameter, 400, "invalid_request_error", anthropic.BadRequestError),
        (RC.InvalidAPIKey, 401, "authentication_error", anthropic.AuthenticationError),
        (RC.KudosUpfront, 402, "billing_error", anthropic.PaymentRequiredError),
        (RC.TimeoutIP, 403, "permission_error", anthropic.PermissionDeniedError),
        (RC.model_not_found, 404, "not_found_error", anthropic.NotFoundError),
        (RC.RequestTimeout, 408, "timeout_error", anthropic.RequestTimeoutError),
        (RC.PayloadTooLarge, 413, "request_too_large", anthropic.ContentTooLargeError),
        (RC.TooManyPrompts, 429, "rate_limit_error", anthropic.RateLimitError),
        (RC.InternalServerError, 500, "api_error", anthropic.InternalServerError),
        (RC.ChatRequestFaulted, 502, "api_error", anthropic.InternalServerError),
        (RC.FrontAtCapacity, 529, "overloaded_error", anthropic.OverloadedError),
        (RC.queue_unavailable, 529, "overloaded_error", anthropic.OverloadedError),
    ],
)
def test_each_refusal_has_anthropics_status_and_type(
    rc: RC, status_code: int, kind: str, sdk_error: type[anthropic.APIStatusError]
) -> None:
    answer = envelopes.anthropic(
        HordeError(rc, param="x") if rc is RC.UnsupportedChatParameter else HordeError(rc)
    )
    body = json.loads(answer.body)
    assert (answer.status, body["error"]["type"]) == (status_code, kind)
    if kind != "request_too_large":  # documented by Anthropic, not in the SDK's union
        ErrorResponse.model_validate(body)
    with pytest.raises(sdk_error) as caught:
        client(lambda _: httpx2.Response(answer.status, json=body)).messages.create(**ASK)
    assert caught.value.status_code == status_code


def test_a_held_refusal_says_not_to_retry_and_names_the_request() -> None:
    exc = HordeError(RC.queue_unavailable, "Busy.", retry_after=30)
    answer = envelopes.anthropic(exc, held=True, metadata={"request_id": RID})
    assert ("x-should-retry", "false") in answer.headers
    assert ("Retry-After", "30") in answer.headers
    assert json.loads(answer.body) == {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": "Busy.",
            "code": "queue_unavailable",
            "param": None,
            "metadata": {"retry_after": 30},
        },
        "request_id": RID,
    }


def test_a_refusal_names_its_field() -> None:
    with pytest.raises(HordeError) as caught:
        parse_messages_request({**ASK, "top_k": 3})
    body = json.loads(envelopes.anthropic(caught.value).body)
    assert body["error"]["param"] == "top_k"
    assert body["error"]["code"] == "UnsupportedChatParameter"


# count_tokens and the models list --------------------------------------------------------------


def test_the_count_is_the_input_a_message_reports_when_its_worker_counts_none() -> None:
    ask = {
        "model": "m1",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    }
    counted = token_count(parse_count_tokens_request(ask))
    req = parse_chat_request(parse_messages_request({**ask, "max_tokens": 64}).chat)
    prompt_chars = len(flatten_messages(req.messages, req.tools))
    usage = message(shape(prompt_chars=prompt_chars), status(reply()))["usage"]
    assert counted["input_tokens"] == usage["input_tokens"] > 0
    assert (
        counted
        == client(lambda _: httpx2.Response(200, json=counted))
        .messages.count_tokens(**ask)
        .to_dict()
    )


SUMMARY = {"workers": 2, "max_context_length": 8192, "max_length": 512, "features": ["tools"]}
ENTRIES = [model_entry(name, SUMMARY) for name in ("a", "b", "c", "d")]


def test_a_model_entry_is_anthropics_model_info() -> None:
    info = ModelInfo.model_validate(ENTRIES[0])
    assert (info.id, info.display_name, info.max_input_tokens, info.max_tokens) == (
        "a",
        "a",
        8192,
        512,
    )


@pytest.mark.parametrize(
    ("cursors", "ids", "more"),
    [
        ({}, ["a", "b"], True),
        ({"after_id": "b"}, ["c", "d"], False),
        ({"after_id": "a"}, ["b", "c"], True),
        ({"before_id": "d"}, ["b", "c"], True),
        ({"before_id": "b"}, ["a"], False),
    ],
)
def test_the_models_list_pages(cursors: dict[str, str], ids: list[str], more: bool) -> None:
    page = models_page(ENTRIES, limit=2, **cursors)
    assert [e["id"] for e in page["data"]] == ids
    assert page["has_more"] is more
    assert (page["first_id"], page["last_id"]) == (ids[0], ids[-1])


def test_a_cursor_naming_no_model_is_refused() -> None:
    for cursors in ({"after_id": "zz"}, {"before_id": "zz"}, {"after_id": "a", "before_id": "c"}):
        with pytest.raises(HordeError):
            models_page(ENTRIES, limit=2, **cursors)
    assert models_page([], limit=20) == {
        "data": [],
        "has_more": False,
        "first_id": None,
        "last_id": None,
    }
