"""The Messages API request contract (contract/messages_request.py): each
field's mapping onto the chat request, each refusal by field, and the
recorded requests of Claude Code and the anthropic SDK (tests/fixtures/messages)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hordelite.contract.chat_request import ChatRequest, parse_chat_request
from hordelite.contract.limits import MAX_CHAT_STOP, MAX_MAX_LENGTH
from hordelite.contract.messages_request import (
    OUTPUT_FORMAT_NAME,
    TOOL_ERROR_MARK,
    MessagesCall,
    check_beta_flags,
    parse_count_tokens_request,
    parse_messages_request,
)
from hordelite.errors import RC, HordeError

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "messages"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
SCHEMA = WEATHER["input_schema"]


def recorded(name: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads((RECORDINGS / name).read_text())["requests"]
    return requests


def body(**fields: Any) -> dict[str, Any]:
    """A minimal Messages body, with ``fields`` set (None removes one)."""
    out: dict[str, Any] = {
        "model": "m1",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Say hello"}],
    }
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


def translate(raw: dict[str, Any], **options: Any) -> tuple[MessagesCall, ChatRequest]:
    """The call, and its chat body as the chat contract takes it: every
    body translated must pass it (a refusal there would name a chat field)."""
    call = parse_messages_request(raw, **options)
    return call, parse_chat_request(copy.deepcopy(call.chat))


def refusal(raw: dict[str, Any], **options: Any) -> HordeError:
    with pytest.raises(HordeError) as caught:
        parse_messages_request(raw, **options)
    return caught.value


# The recorded requests ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "claude_code_print.json",
        "claude_code_print_default_model.json",
        "anthropic_sdk_plain.json",
        "anthropic_sdk_stream.json",
        "anthropic_sdk_tool.json",
    ],
)
def test_every_recorded_request_is_taken_with_its_beta_flags(name: str) -> None:
    for request in recorded(name):
        check_beta_flags(request["headers"].get("anthropic-beta"))
        call, req = translate(request["body"])
        assert call.stream is bool(request["body"].get("stream"))
        assert req.models == (request["body"]["model"],)


def test_claude_codes_request_maps_field_by_field() -> None:
    (request,) = recorded("claude_code_print.json")
    raw = request["body"]
    call, req = translate(raw)
    # Three system blocks (two with cache_control, a no-op) are one system
    # message of three text parts; the user's turn follows; the system
    # message Claude Code sends after it stays a system message there.
    system, user, reminder = req.messages
    assert system == {
        "role": "system",
        "content": [{"type": "text", "text": b["text"]} for b in raw["system"]],
    }
    assert user["role"] == "user"
    assert [p["text"] for p in user["content"]][-1] == "Say hello"
    assert reminder == {"role": "system", "content": raw["messages"][1]["content"][0]["text"]}
    # thinking adaptive, display omitted: thinking blocks without their text;
    # output_config.effort high is the reasoning_effort.
    assert call.thinking == "omitted"
    assert req.reasoning_effort == "high"
    # max_tokens 32000 is lowered to the horde's bound, and said so.
    assert req.max_length == MAX_MAX_LENGTH
    assert call.adjustments == (
        {
            "field": "max_tokens",
            "requested": 32000,
            "applied": MAX_MAX_LENGTH,
            "reason": "the largest max_tokens a horde request may ask for",
        },
    )
    # Every tool is offered, the deferred one too (defer_loading is a no-op).
    assert [t["function"]["name"] for t in req.tools or ()] == [t["name"] for t in raw["tools"]]
    assert req.stream
    assert req.tool_choice is None


def test_claude_codes_per_turn_effort_is_the_replys() -> None:
    (request,) = recorded("claude_code_print_default_model.json")
    raw = request["body"]
    assert raw["messages"][1]["output_config"] == {"effort": "medium"}
    raw["output_config"] = {"effort": "low"}
    _, req = translate(raw)
    assert req.reasoning_effort == "medium"  # the message's, over the body's


def test_the_recorded_tool_round_trip_pairs_the_call_with_its_result() -> None:
    _, second = recorded("anthropic_sdk_tool.json")
    _, req = translate(second["body"])
    _user, assistant, tool = req.messages
    assert assistant == {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "toolu_10",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "x"}'},
            }
        ],
    }
    assert tool == {"role": "tool", "tool_call_id": "toolu_10", "content": "18 C and sunny"}
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": SCHEMA,
            },
        }
    ]


def test_the_recorded_count_tokens_request_becomes_a_chat_body_without_a_budget() -> None:
    (request,) = recorded("anthropic_sdk_count_tokens.json")
    call = parse_count_tokens_request(request["body"])
    req = parse_chat_request(call.chat)
    assert req.max_length is None
    assert not req.stream
    assert req.tools is not None
    assert req.tools[0]["function"]["name"] == "get_weather"


# Mappings --------------------------------------------------------------------------------


def test_the_sampling_fields_and_stop_sequences_are_the_chat_requests() -> None:
    _, req = translate(body(temperature=0.2, top_p=0.5, stop_sequences=["\nUser:", "END"]))
    assert req.sampling["temperature"] == 0.2
    assert req.sampling["top_p"] == 0.5
    assert req.stop == ["\nUser:", "END"]
    assert req.max_length == 64


def test_the_no_ops_are_taken_and_change_nothing() -> None:
    plain = parse_messages_request(body())
    noisy = parse_messages_request(
        body(
            metadata={"user_id": "u-1"},
            cache_control={"type": "ephemeral"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            service_tier="auto",
            speed="standard",
            system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        )
    )
    assert noisy.chat["messages"][1:] == plain.chat["messages"]
    assert noisy.chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert {k: v for k, v in noisy.chat.items() if k != "messages"} == {
        k: v for k, v in plain.chat.items() if k != "messages"
    }


def test_an_empty_system_is_none() -> None:
    for system in ("", []):
        call, _ = translate(body(system=system))
        assert call.chat["messages"] == [{"role": "user", "content": "Say hello"}]


def test_consecutive_turns_of_one_role_are_combined() -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": "three"},
    ]
    _, req = translate(body(messages=messages))
    assert req.messages == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "user", "content": "three"},
    ]


def test_images_become_image_url_parts() -> None:
    content = [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What are these?"},
    ]
    _, req = translate(body(messages=[{"role": "user", "content": content}]))
    assert req.has_images
    assert req.messages[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What are these?"},
    ]


def tool_round(
    result: dict[str, Any], *, extra: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A conversation whose assistant calls get_weather and whose user answers with ``result``."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, use]},
        {
            "role": "user",
            "content": [
                {"tool_use_id": "toolu_1", "type": "tool_result", **result},
                *(extra or []),
            ],
        },
    ]


def test_a_tool_round_trip_becomes_calls_then_tool_messages_then_the_users_text() -> None:
    messages = tool_round(
        {"content": [{"type": "text", "text": "18 C"}, {"type": "text", "text": "sunny"}]},
        extra=[{"type": "text", "text": "And tomorrow?"}],
    )
    _, req = translate(body(messages=messages, tools=[WEATHER]))
    assert req.messages[1] == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert req.messages[2:] == [
        {
            "role": "tool",
            "tool_call_id": "toolu_1",
            "content": [{"type": "text", "text": "18 C"}, {"type": "text", "text": "sunny"}],
        },
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_a_tool_result_marked_is_error_says_so_first() -> None:
    _, req = translate(
        body(messages=tool_round({"content": "no such city", "is_error": True}), tools=[WEATHER])
    )
    assert req.messages[2]["content"] == [
        {"type": "text", "text": TOOL_ERROR_MARK},
        {"type": "text", "text": "no such city"},
    ]


def test_a_tool_result_without_content_is_empty() -> None:
    for result in ({}, {"content": []}, {"content": ""}):
        _, req = translate(body(messages=tool_round(result), tools=[WEATHER]))
        assert req.messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": ""}


def test_a_tool_reference_is_the_definition_of_the_tool_it_names() -> None:
    messages = tool_round({"content": [{"type": "tool_reference", "tool_name": "get_weather"}]})
    _, req = translate(body(messages=messages, tools=[WEATHER]))
    assert json.loads(req.messages[2]["content"]) == {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": SCHEMA,
    }


def test_thinking_carried_back_is_checked_and_not_sent_on() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Greet back.", "signature": "hordelite:abc"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Hello!", "citations": None},
            ],
        },
        {"role": "user", "content": "Bye"},
    ]
    _, req = translate(body(messages=messages))
    assert req.messages[1] == {"role": "assistant", "content": "Hello!"}


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any"}, "required", True),
        ({"type": "none"}, "none", True),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
            True,
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tool_choice_maps_onto_the_chat_tool_choice(
    choice: dict[str, Any], expected: Any, parallel: bool
) -> None:
    _, req = translate(body(tools=[WEATHER], tool_choice=choice))
    assert req.tool_choice == expected
    assert req.parallel_tool_calls is parallel


def test_tool_choice_auto_or_none_without_tools_changes_nothing() -> None:
    for kind in ("auto", "none"):
        call, _ = translate(body(tool_choice={"type": kind}))
        assert "tool_choice" not in call.chat
        assert "tools" not in call.chat


def test_a_strict_tool_keeps_strict() -> None:
    _, req = translate(body(tools=[{**WEATHER, "strict": True, "eager_input_streaming": True}]))
    assert req.tools is not None
    assert req.tools[0]["function"]["strict"] is True


@pytest.mark.parametrize(
    ("thinking", "shown", "effort"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, "summarized", "low"),
        ({"type": "enabled", "budget_tokens": 4095}, "summarized", "low"),
        ({"type": "enabled", "budget_tokens": 4096}, "summarized", "medium"),
        ({"type": "enabled", "budget_tokens": 16384, "display": "omitted"}, "omitted", "high"),
        ({"type": "adaptive"}, "summarized", None),
        ({"type": "adaptive", "display": "omitted"}, "omitted", None),
        ({"type": "disabled"}, None, None),
    ],
)
def test_thinking_gives_the_thinking_shown_and_its_budget_an_effort(
    thinking: dict[str, Any], shown: str | None, effort: str | None
) -> None:
    call, req = translate(body(max_tokens=32000, thinking=thinking))
    assert call.thinking == shown
    assert req.reasoning_effort == effort


def test_output_config_effort_is_the_reasoning_effort_over_the_budgets() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2000}
    for effort in ("low", "medium", "high", "xhigh"):
        _, req = translate(
            body(max_tokens=32000, thinking=thinking, output_config={"effort": effort})
        )
        assert req.reasoning_effort == effort


def test_an_effort_is_a_hint_under_best_effort_and_the_answer_says_so() -> None:
    raw = body(output_config={"effort": "high"})
    call, req = translate(raw, conformance="best_effort")
    assert req.reasoning_effort is None
    assert call.adjustments == (
        {
            "field": "effort",
            "requested": "high",
            "applied": None,
            "reason": "conformance best_effort: an effort is a hint, not sent to the worker",
        },
    )
    # The body's own horde object decides over the call's default.
    _, req = translate({**raw, "horde": {"conformance": "strict"}}, conformance="best_effort")
    assert req.reasoning_effort == "high"
    call, req = translate({**raw, "horde": {"conformance": "best_effort"}})
    assert req.reasoning_effort is None
    assert req.horde.conformance == "best_effort"


def test_a_message_effort_holds_until_the_next_reply() -> None:
    messages = [
        {"role": "user", "content": "one", "output_config": {"effort": "low"}},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "two"},
    ]
    _, req = translate(body(messages=messages, output_config={"effort": "high"}))
    assert req.reasoning_effort == "high"  # the low one was asked of the reply given


def test_output_config_format_is_a_strict_json_schema_response_format() -> None:
    _, req = translate(body(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}))
    assert req.response_format == {
        "type": "json_schema",
        "json_schema": {"name": OUTPUT_FORMAT_NAME, "schema": SCHEMA, "strict": True},
    }


def test_models_and_the_horde_object_pass_through() -> None:
    raw = body(model=None, models=["m1", "m2"], horde={"availability_mode": "fail_fast"})
    call, req = translate(raw)
    assert call.model == "m1"
    assert req.models == ("m1", "m2")
    assert req.horde.availability_mode == "fail_fast"


def test_stream_is_the_chat_requests() -> None:
    call, req = translate(body(stream=True))
    assert call.stream
    assert req.stream


def test_count_tokens_takes_the_fields_that_shape_the_prompt() -> None:
    raw = body(
        max_tokens=None,
        system="Be brief.",
        tools=[WEATHER],
        tool_choice={"type": "auto"},
        thinking={"type": "adaptive"},
    )
    call = parse_count_tokens_request(raw)
    assert call.chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "max_tokens" not in call.chat
    assert call.thinking == "summarized"


# Refusals, by field ------------------------------------------------------------------------

TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


def user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def answered(*uses: Any) -> list[dict[str, Any]]:
    """A conversation whose assistant message holds ``uses``, answered by a
    result for toolu_1."""
    return [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": list(uses)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ]


REFUSALS: list[tuple[str, dict[str, Any], str, RC]] = [
    ("top_k", body(top_k=5), "top_k", RC.UnsupportedChatParameter),
    (
        "mcp_servers",
        body(mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}]),
        "mcp_servers",
        RC.UnsupportedChatParameter,
    ),
    ("container", body(container="c1"), "container", RC.UnsupportedChatParameter),
    ("inference_geo", body(inference_geo="us"), "inference_geo", RC.UnsupportedChatParameter),
    ("unknown key", body(foo=1), "foo", RC.UnsupportedChatParameter),
    ("a no-op of the wrong type", body(cache_control=3), "cache_control", RC.BadRequest),
    ("max_tokens missing", body(max_tokens=None), "max_tokens", RC.BadRequest),
    ("max_tokens 0", body(max_tokens=0), "max_tokens", RC.BadRequest),
    ("max_tokens a string", body(max_tokens="64"), "max_tokens", RC.BadRequest),
    ("model missing", body(model=None), "model", RC.BadRequest),
    ("temperature over 1", body(temperature=1.5), "temperature", RC.BadRequest),
    ("top_p a string", body(top_p="x"), "top_p", RC.BadRequest),
    ("stop_sequences a string", body(stop_sequences="END"), "stop_sequences", RC.BadRequest),
    (
        "too many stop_sequences",
        body(stop_sequences=["a"] * (MAX_CHAT_STOP + 1)),
        "stop_sequences",
        RC.BadRequest,
    ),
    ("stream a string", body(stream="yes"), "stream", RC.BadRequest),
    (
        "metadata key",
        body(metadata={"tenant": "x"}),
        "metadata.tenant",
        RC.UnsupportedChatParameter,
    ),
    ("metadata.user_id a number", body(metadata={"user_id": 3}), "metadata.user_id", RC.BadRequest),
    (
        "thinking between_tools",
        body(thinking={"type": "between_tools"}),
        "thinking.type",
        RC.UnsupportedChatParameter,
    ),
    (
        "thinking key",
        body(thinking={"type": "adaptive", "budget_tokens": 2000}),
        "thinking.budget_tokens",
        RC.UnsupportedChatParameter,
    ),
    (
        "thinking budget missing",
        body(thinking={"type": "enabled"}),
        "thinking.budget_tokens",
        RC.BadRequest,
    ),
    (
        "thinking budget small",
        body(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 1000}),
        "thinking.budget_tokens",
        RC.BadRequest,
    ),
    (
        "thinking budget over max_tokens",
        body(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}),
        "thinking.budget_tokens",
        RC.BadRequest,
    ),
    (
        "thinking display",
        body(thinking={"type": "adaptive", "display": "full"}),
        "thinking.display",
        RC.BadRequest,
    ),
    (
        "effort max",
        body(output_config={"effort": "max"}),
        "output_config.effort",
        RC.UnsupportedChatParameter,
    ),
    (
        "output_config key",
        body(output_config={"verbosity": "low"}),
        "output_config.verbosity",
        RC.UnsupportedChatParameter,
    ),
    (
        "format type",
        body(output_config={"format": {"type": "json_object"}}),
        "output_config.format.type",
        RC.UnsupportedChatParameter,
    ),
    (
        "format schema missing",
        body(output_config={"format": {"type": "json_schema"}}),
        "output_config.format.schema",
        RC.BadRequest,
    ),
    (
        "format schema open",
        body(
            output_config={
                "format": {"type": "json_schema", "schema": {"type": "object", "properties": {}}}
            }
        ),
        "output_config.format.schema",
        RC.ChatRequestInvalid,
    ),
    (
        "a message's format",
        body(
            messages=[
                {
                    "role": "user",
                    "content": "x",
                    "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
                }
            ]
        ),
        "messages[0].output_config.format",
        RC.UnsupportedChatParameter,
    ),
    (
        "web search tool",
        body(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "tools[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "bash tool",
        body(tools=[WEATHER, {"type": "bash_20250124", "name": "bash"}]),
        "tools[1].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "text editor tool",
        body(tools=[{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]),
        "tools[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "computer tool",
        body(
            tools=[
                {
                    "type": "computer_20250124",
                    "name": "computer",
                    "display_width_px": 1,
                    "display_height_px": 1,
                }
            ]
        ),
        "tools[0].type",
        RC.UnsupportedChatParameter,
    ),
    ("tool name", body(tools=[{**WEATHER, "name": "get weather"}]), "tools[0].name", RC.BadRequest),
    ("tool names repeated", body(tools=[WEATHER, WEATHER]), "tools[1].name", RC.ChatRequestInvalid),
    ("input_schema missing", body(tools=[{"name": "t"}]), "tools[0].input_schema", RC.BadRequest),
    (
        "input_examples",
        body(tools=[{**WEATHER, "input_examples": [{"city": "Paris"}]}]),
        "tools[0].input_examples",
        RC.UnsupportedChatParameter,
    ),
    (
        "allowed_callers",
        body(tools=[{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]),
        "tools[0].allowed_callers",
        RC.UnsupportedChatParameter,
    ),
    (
        "strict on an open schema",
        body(
            tools=[
                {
                    "name": "t",
                    "strict": True,
                    "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                }
            ]
        ),
        "tools[0].input_schema",
        RC.ChatRequestInvalid,
    ),
    (
        "tool key",
        body(tools=[{**WEATHER, "color": "red"}]),
        "tools[0].color",
        RC.UnsupportedChatParameter,
    ),
    (
        "tool_choice type",
        body(tools=[WEATHER], tool_choice={"type": "required"}),
        "tool_choice.type",
        RC.BadRequest,
    ),
    (
        "tool_choice name",
        body(tools=[WEATHER], tool_choice={"type": "tool", "name": "other"}),
        "tool_choice.name",
        RC.ChatRequestInvalid,
    ),
    (
        "tool_choice any without tools",
        body(tool_choice={"type": "any"}),
        "tool_choice",
        RC.ChatRequestInvalid,
    ),
    ("messages empty", body(messages=[]), "messages", RC.BadRequest),
    (
        "role",
        body(messages=[{"role": "developer", "content": "x"}]),
        "messages[0].role",
        RC.BadRequest,
    ),
    (
        "message key",
        body(messages=[{"role": "user", "content": "x", "name": "bob"}]),
        "messages[0].name",
        RC.UnsupportedChatParameter,
    ),
    (
        "content empty",
        body(messages=[{"role": "user", "content": []}]),
        "messages[0].content",
        RC.BadRequest,
    ),
    (
        "document block",
        body(messages=user({"type": "document", "source": {}})),
        "messages[0].content[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "search_result block",
        body(messages=user({"type": "search_result"})),
        "messages[0].content[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "block key",
        body(messages=user({"type": "text", "text": "x", "lang": "en"})),
        "messages[0].content[0].lang",
        RC.UnsupportedChatParameter,
    ),
    (
        "citations",
        body(
            messages=user({"type": "text", "text": "x", "citations": [{"type": "char_location"}]})
        ),
        "messages[0].content[0].citations",
        RC.UnsupportedChatParameter,
    ),
    (
        "image media type",
        body(
            messages=user(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="},
                }
            )
        ),
        "messages[0].content[0].source.media_type",
        RC.BadRequest,
    ),
    (
        "image file source",
        body(messages=user({"type": "image", "source": {"type": "file", "file_id": "f1"}})),
        "messages[0].content[0].source.type",
        RC.UnsupportedChatParameter,
    ),
    (
        "image url",
        body(messages=user({"type": "image", "source": {"type": "url", "url": "ftp://x/y.png"}})),
        "messages[0].content[0].source.url",
        RC.BadRequest,
    ),
    (
        "image in a system message",
        body(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "system", "content": [{"type": "image", "source": {}}]},
            ]
        ),
        "messages[1].content[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "tool_use in a user message",
        body(messages=user(TOOL_USE)),
        "messages[0].content[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "tool_use input",
        body(messages=answered({**TOOL_USE, "input": "{}"})),
        "messages[1].content[0].input",
        RC.BadRequest,
    ),
    (
        "tool_use caller",
        body(messages=answered({**TOOL_USE, "caller": {"type": "code_execution_20250825"}})),
        "messages[1].content[0].caller",
        RC.UnsupportedChatParameter,
    ),
    (
        "image in a tool result",
        body(tools=[WEATHER], messages=tool_round({"content": [{"type": "image", "source": {}}]})),
        "messages[2].content[0].content[0].type",
        RC.UnsupportedChatParameter,
    ),
    (
        "tool_reference to no tool",
        body(
            tools=[WEATHER],
            messages=tool_round({"content": [{"type": "tool_reference", "tool_name": "nope"}]}),
        ),
        "messages[2].content[0].content[0].tool_name",
        RC.ChatRequestInvalid,
    ),
    (
        "is_error a string",
        body(tools=[WEATHER], messages=tool_round({"content": "x", "is_error": "yes"})),
        "messages[2].content[0].is_error",
        RC.BadRequest,
    ),
    (
        "text before a tool_result",
        body(
            tools=[WEATHER],
            messages=[
                *tool_round({})[:2],
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x"},
                        {"type": "tool_result", "tool_use_id": "toolu_1"},
                    ],
                },
            ],
        ),
        "messages[2].content[1]",
        RC.ChatRequestInvalid,
    ),
    (
        "a tool_use unanswered",
        body(messages=[*tool_round({})[:2], {"role": "user", "content": "x"}]),
        "messages[1]",
        RC.ChatRequestInvalid,
    ),
    (
        "a tool_result answering nothing",
        body(
            messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}
            ]
        ),
        "messages[0].content[0].tool_use_id",
        RC.ChatRequestInvalid,
    ),
    (
        "tool_use ids repeated",
        body(messages=answered(TOOL_USE, TOOL_USE)),
        "messages[1].content[1].id",
        RC.ChatRequestInvalid,
    ),
    (
        "a final assistant message",
        body(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "The answer is ("},
            ]
        ),
        "messages[1]",
        RC.ChatRequestInvalid,
    ),
    (
        "a system block that is not text",
        body(system=[{"type": "image", "source": {}}]),
        "system[0].type",
        RC.UnsupportedChatParameter,
    ),
    ("system a number", body(system=3), "system", RC.BadRequest),
]


@pytest.mark.parametrize(
    ("raw", "param", "rc"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_each_refusal_names_its_field(raw: dict[str, Any], param: str, rc: RC) -> None:
    exc = refusal(raw)
    assert (exc.extra.get("param"), exc.rc) == (param, rc), exc.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (body(max_tokens=64), "max_tokens"),
        (body(max_tokens=None, stream=True), "stream"),
        (body(max_tokens=None, temperature=0.5), "temperature"),
        (body(max_tokens=None, horde={}), "horde"),
    ],
)
def test_count_tokens_refuses_what_only_shapes_a_reply(raw: dict[str, Any], param: str) -> None:
    with pytest.raises(HordeError) as caught:
        parse_count_tokens_request(raw)
    assert caught.value.extra.get("param") == param


def test_a_null_key_counts_as_absent() -> None:
    call, _ = translate(body(top_k=None, foo=None, tools=[{**WEATHER, "input_examples": None}]))
    assert "top_k" not in call.chat


# Beta flags ------------------------------------------------------------------------------


def test_the_beta_flags_claude_code_sends_are_taken() -> None:
    header = (
        "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
        "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,"
        "thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24,"
        " prompt-caching-2024-07-31 , fine-grained-tool-streaming-2025-05-14,"
        "mid-conversation-system-2026-01-01"
    )
    assert len(check_beta_flags(header)) == 11
    assert check_beta_flags(None) == check_beta_flags("") == ()


@pytest.mark.parametrize(
    "flag",
    [
        "files-api-2025-04-14",
        "code-execution-2025-05-22",
        "mcp-client-2025-04-04",
        "computer-use-2025-01-24",
        "something-new",
    ],
)
def test_a_beta_flag_whose_feature_is_not_offered_is_refused_by_name(flag: str) -> None:
    with pytest.raises(HordeError) as caught:
        check_beta_flags(f"claude-code-20250219,{flag}")
    assert caught.value.extra["param"] == "anthropic-beta"
    assert repr(flag) in caught.value.message
