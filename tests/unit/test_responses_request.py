"""The Responses API request contract (contract/responses_request.py): each
field's mapping onto the chat request, and each refusal by the Responses
field it names, with nothing queued (the parser is pure)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.responses_request import (
    ResponsesCall,
    ResponsesEcho,
    flat_name,
    parse_responses_request,
    request_id_of,
    response_id,
)
from hordelite.errors import RC, HordeError
from tests.chat_shapes import string_object
from tests.unit.test_chat_properties import (
    assert_accepts_or_refuses_with_4xx,
    mutated,
    one_field_replaced,
)

CODEX_RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "responses" / "codex_exec.json"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": string_object(["city"], closed=True),
    "strict": True,
}

# A body in the shape Codex CLI sends (issue 38's recording): developer
# messages, input_text parts, function tools, a namespace, the hosted
# web_search, reasoning summary, encrypted reasoning asked for, not stored.
CODEX_BODY: dict[str, Any] = {
    "model": "fake-model",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Run.", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "namespace", "name": "mcp__docs__", "description": "Docs.",
         "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "019a-session",
}  # fmt: skip


def parse(body: dict[str, Any]) -> ResponsesCall:
    return parse_responses_request(body)


def chat(body: dict[str, Any]) -> ChatRequest:
    return parse_responses_request(body).chat_request()


def refusal(body: Any) -> HordeError:
    """The refusal of ``body``, whether the Responses check or the chat
    contract it is translated for makes it."""
    with pytest.raises(HordeError) as caught:
        parse_responses_request(body).chat_request()
    return caught.value


def body_with(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", **fields}


# Input ------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    req = chat(body_with(instructions="Be brief."))
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert req.models == ("m",)


def test_message_items_map_their_roles_and_parts() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    req = chat(
        body_with(
            input=[
                {"role": "developer", "content": "dev"},
                {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
                {"role": "user", "content": [{"type": "input_text", "text": "look"}, image]},
                {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png"}]},
            ]
        )
    )  # fmt: skip
    assert req.messages == [
        {"role": "system", "content": "dev"},  # developer is sent as system
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": image["image_url"], "detail": "low"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "auto"}}
            ],
        },
    ]
    assert req.has_images


def test_function_calls_join_the_assistant_message_and_outputs_are_tool_messages() -> None:
    req = chat(
        body_with(
            input=[
                {"role": "user", "content": "Weather in Paris and Oslo?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "Checking.", "annotations": []},
                        {"type": "refusal", "refusal": "Not that."},
                    ],
                },
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "reasoning", "id": "rs_2", "summary": []},
                {"type": "function_call", "call_id": "c2", "name": "search", "namespace": "mcp__docs__",
                 "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "doc"}]},
                {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": ""},
                {"type": "function_call_output", "call_id": "c3", "output": "rain"},
            ],
            tools=[WEATHER],
        )
    )  # fmt: skip
    assert req.messages[1:] == [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Checking."}, {"type": "text", "text": "Not that."}],
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "mcp__docs__search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "tool", "content": [{"type": "text", "text": "doc"}], "tool_call_id": "c2"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "c3"},
    ]  # fmt: skip


def test_reasoning_items_carried_back_are_not_sent() -> None:
    req = chat(
        body_with(
            input=[
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
                {"role": "user", "content": "Hi"},
            ]
        )
    )  # fmt: skip
    assert req.messages == [{"role": "user", "content": "Hi"}]


def test_an_unanswered_function_call_is_refused_naming_its_item() -> None:
    exc = refusal(
        body_with(
            input=[
                {"role": "user", "content": "Hi"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ]
        )
    )
    assert (exc.rc, exc.extra["param"]) == (RC.ChatRequestInvalid, "input[1]")


def test_history_goes_after_the_instructions_and_before_the_input() -> None:
    call = parse(body_with(instructions="New rules."))
    history = [{"role": "user", "content": "Before"}, {"role": "assistant", "content": "Sure"}]
    assert [m["content"] for m in call.chat_request(history).messages] == [
        "New rules.",
        "Before",
        "Sure",
        "Hi",
    ]
    no_instructions = parse(body_with())
    assert [m["content"] for m in no_instructions.chat_request(history).messages] == [
        "Before",
        "Sure",
        "Hi",
    ]
    # A refusal of the history names the field that brought it.
    bad = [{"role": "tool", "tool_call_id": "x", "content": "?"}]
    with pytest.raises(HordeError) as caught:
        call.chat_request(bad)
    assert caught.value.extra["param"] == "previous_response_id"


def test_no_input_and_no_instructions_is_refused_naming_input() -> None:
    exc = refusal({"model": "m"})
    assert exc.extra["param"] == "input"
    assert "'input'" in exc.message


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ("text", "input[0]"),
        ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
        ({"type": "web_search_call", "id": "ws", "status": "completed"}, "input[0].type"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": ""}, "input[0].type"),
        ({"type": "local_shell_call", "call_id": "c"}, "input[0].type"),
        ({"type": "computer_call_output", "call_id": "c"}, "input[0].type"),
        ({"type": None, "role": "user", "content": "x"}, "input[0].type"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"role": "user"}, "input[0].content"),
        ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}, "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "output_text", "text": "x"}]}, "input[0].content[0].type"),
        ({"role": "user", "content": ["x"]}, "input[0].content[0]"),
        ({"role": "user", "content": [{"type": "input_text", "text": 1}]}, "input[0].content[0].text"),
        ({"role": "system", "content": [{"type": "input_image", "image_url": "https://x"}]},
         "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]},
         "input[0].content[0].file_id"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]},
         "input[0].content[0].image_url"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "https://x", "detail": "original"}]},
         "input[0].content[0].detail"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "input[0].name"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}, "input[0].arguments"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "", "namespace": 3},
         "input[0].namespace"),
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": None}, "input[0].output"),
        ({"type": "function_call_output", "call_id": "c",
          "output": [{"type": "input_image", "image_url": "https://x"}]}, "input[0].output[0].type"),
        ({"type": "function_call_output", "call_id": "c", "output": [3]}, "input[0].output[0]"),
    ],
)  # fmt: skip
def test_each_input_item_refusal_names_its_field(item: Any, param: str) -> None:
    exc = refusal(body_with(input=[item]))
    assert exc.extra["param"] == param
    assert exc.status == 400


def test_input_and_instructions_of_the_wrong_type_are_refused() -> None:
    assert refusal(body_with(input=3)).extra["param"] == "input"
    assert refusal(body_with(instructions=["x"])).extra["param"] == "instructions"


# Tools --------------------------------------------------------------------------------


def test_function_tools_are_chat_functions_and_echoed() -> None:
    call = parse(
        body_with(tools=[WEATHER, {"type": "function", "name": "now"}], tool_choice="required")
    )
    req = call.chat_request()
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER["description"],
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "now"}},
    ]
    assert req.tool_choice == "required"
    assert call.echo.fields["tools"][1] == {
        "type": "function",
        "name": "now",
        "description": None,
        "parameters": None,
        "strict": False,  # omitted is not strict (decision 0078)
    }
    assert call.echo.fields["tool_choice"] == "required"


def test_namespace_functions_are_flattened_and_split_again() -> None:
    call = parse(body_with(tools=CODEX_BODY["tools"][:2]))
    assert [t["function"]["name"] for t in call.chat_request().tools or []] == [
        "exec_command",
        "mcp__docs__search",
    ]
    assert call.echo.function("mcp__docs__search") == {"name": "search", "namespace": "mcp__docs__"}
    assert call.echo.function("exec_command") == {"name": "exec_command"}
    assert call.echo.fields["tools"][1]["type"] == "namespace"
    assert flat_name("ns", "_f") == "ns__f" == flat_name("ns__", "f")


def test_a_named_tool_choice_and_parallel_tool_calls_map_onto_the_chat_request() -> None:
    body = body_with(
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
    )
    call = parse(body)
    req = call.chat_request()
    assert req.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert req.parallel_tool_calls is False
    assert call.echo.fields["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert call.echo.fields["parallel_tool_calls"] is False


def test_auto_none_and_parallel_tool_calls_without_tools_change_nothing() -> None:
    for choice in ("auto", "none"):
        req = chat(body_with(tool_choice=choice, parallel_tool_calls=True))
        assert (req.tools, req.tool_choice) == (None, None)
    exc = refusal(body_with(tool_choice="required"))
    assert (exc.rc, exc.extra["param"]) == (RC.ChatRequestInvalid, "tool_choice")


HOSTED = [
    "file_search",
    "computer_use_preview",
    "computer",
    "code_interpreter",
    "mcp",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
    "tool_search",
    "web_search",
    "web_search_preview",
]


@pytest.mark.parametrize("kind", HOSTED)
def test_hosted_and_custom_tools_are_refused_by_name(kind: str) -> None:
    exc = refusal(body_with(tools=[WEATHER, {"type": kind}]))
    assert (exc.rc, exc.extra["param"]) == (RC.UnsupportedChatParameter, "tools[1].type")
    assert repr(kind) in exc.message


def test_web_search_under_best_effort_is_dropped_and_listed() -> None:
    call = parse(
        body_with(tools=[{"type": "web_search"}, WEATHER], horde={"conformance": "best_effort"})
    )
    req = call.chat_request()
    assert [t["function"]["name"] for t in req.tools or []] == ["get_weather"]
    assert call.echo.dropped_tools == ({"param": "tools[0]", "type": "web_search"},)
    assert [t["type"] for t in call.echo.fields["tools"]] == ["function"]
    # Other hosted tools stay refused under best_effort.
    exc = refusal(body_with(tools=[{"type": "file_search"}], horde={"conformance": "best_effort"}))
    assert exc.extra["param"] == "tools[0].type"


def test_a_strict_web_search_refusal_says_how_to_go_without_it() -> None:
    exc = refusal(CODEX_BODY)
    assert exc.extra["param"] == "tools[2].type"
    assert 'web_search = "disabled"' in exc.message
    assert "best_effort" in exc.message


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        ([{"type": "function"}], "tools[0].name"),
        (["f"], "tools[0]"),
        ([{"type": "function", "name": "f", "defer_loading": True}], "tools[0].defer_loading"),
        ([{"type": "function", "name": "bad name"}], "tools[0].name"),
        ([{"type": "function", "name": "f", "parameters": []}], "tools[0].parameters"),
        ([{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {}}}}],
         "tools[0].parameters"),
        ([{"type": "namespace", "tools": []}], "tools[0].name"),
        ([{"type": "namespace", "name": "ns"}], "tools[0].tools"),
        ([{"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "x"}]}], "tools[0].tools[0].type"),
        ([{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f", "description": 3}]}],
         "tools[0].tools[0].description"),
        ([{"type": "function", "name": "a__b"}, {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]}],
         "tools[1].tools[0].name"),
    ],
)  # fmt: skip
def test_each_tool_refusal_names_its_field(tools: Any, param: str) -> None:
    assert refusal(body_with(tools=tools)).extra["param"] == param


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ({"type": "web_search_preview"}, "tool_choice.type"),
        ({"type": "allowed_tools", "mode": "auto", "tools": []}, "tool_choice.type"),
        ({"type": "function"}, "tool_choice.name"),
        ({"type": "function", "name": "missing"}, "tool_choice"),
        (3, "tool_choice"),
        ("sometimes", "tool_choice"),
    ],
)
def test_each_tool_choice_refusal_names_its_field(choice: Any, param: str) -> None:
    assert refusal(body_with(tools=[WEATHER], tool_choice=choice)).extra["param"] == param


def test_parallel_tool_calls_must_be_a_boolean() -> None:
    assert refusal(body_with(tools=[WEATHER], parallel_tool_calls="no")).extra["param"] == (
        "parallel_tool_calls"
    )


# Text, reasoning, sampling ----------------------------------------------------------------


def test_text_format_json_schema_is_the_response_format() -> None:
    schema = string_object(["city"], closed=True)
    form = {
        "type": "json_schema",
        "name": "forecast",
        "schema": schema,
        "strict": True,
        "description": "d",
    }
    call = parse(body_with(text={"format": form}))
    assert call.chat_request().response_format == {
        "type": "json_schema",
        "json_schema": {"name": "forecast", "schema": schema, "strict": True, "description": "d"},
    }
    assert call.echo.fields["text"] == {"format": form}


def test_text_format_json_object_and_text() -> None:
    assert chat(body_with(text={"format": {"type": "json_object"}})).response_format == {
        "type": "json_object"
    }
    call = parse(body_with(text={"format": {"type": "text"}}))
    assert call.chat_request().response_format is None
    assert call.echo.fields["text"] == {"format": {"type": "text"}}
    assert parse(body_with()).echo.fields["text"] == {"format": {"type": "text"}}


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ("json", "text"),
        ({"format": "json"}, "text.format"),
        ({"format": {"type": "json_schema", "name": "x", "schema": {}, "extra": 1}}, "text.format.extra"),
        ({"format": {"type": "json_schema", "name": "bad name", "schema": {}}}, "text.format.name"),
        ({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
         "text.format"),
        ({"format": {"type": "yaml"}}, "text.format.type"),
        ({"format": {"type": "json_object", "schema": {}}}, "text.format.schema"),
        ({"verbosity": "low"}, "text.verbosity"),
        ({"stop": ["x"]}, "text.stop"),
    ],
)  # fmt: skip
def test_each_text_refusal_names_its_field(text: Any, param: str) -> None:
    exc = refusal(body_with(text=text))
    assert exc.extra["param"] == param
    assert "response_format" not in exc.message


def test_reasoning_effort_is_the_chat_reasoning_effort_and_summary_a_no_op() -> None:
    call = parse(body_with(reasoning={"effort": "low", "summary": "auto"}))
    assert call.chat_request().reasoning_effort == "low"
    assert call.echo.fields["reasoning"] == {"effort": "low", "summary": "auto"}
    call = parse(body_with(reasoning={"generate_summary": "concise"}))
    assert call.chat_request().reasoning_effort is None
    assert call.echo.fields["reasoning"] == {"effort": None, "summary": "concise"}


@pytest.mark.parametrize(
    ("reasoning", "param"),
    [
        ("high", "reasoning"),
        ({"effort": "max"}, "reasoning.effort"),
        ({"summary": "long"}, "reasoning.summary"),
        ({"mode": "pro"}, "reasoning.mode"),
        ({"context": "all_turns"}, "reasoning.context"),
    ],
)
def test_each_reasoning_refusal_names_its_field(reasoning: Any, param: str) -> None:
    assert refusal(body_with(reasoning=reasoning)).extra["param"] == param


def test_max_output_tokens_temperature_and_top_p_map_onto_the_chat_request() -> None:
    call = parse(body_with(max_output_tokens=64, temperature=0.2, top_p=0.5))
    req = call.chat_request()
    assert (req.max_length, req.sampling["temperature"], req.sampling["top_p"]) == (64, 0.2, 0.5)
    fields = call.echo.fields
    assert (fields["max_output_tokens"], fields["temperature"], fields["top_p"]) == (64, 0.2, 0.5)
    defaults = parse(body_with()).echo.fields
    assert (defaults["max_output_tokens"], defaults["temperature"], defaults["top_p"]) == (
        None,
        1.0,
        1.0,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_output_tokens", 0), ("max_output_tokens", "9"), ("temperature", 3), ("top_p", "x")],
)
def test_sampling_refusals_name_the_responses_field(field: str, value: Any) -> None:
    exc = refusal(body_with(**{field: value}))
    assert exc.extra["param"] == field
    assert "max_completion_tokens" not in exc.message


# The other fields ---------------------------------------------------------------------------


def test_the_no_ops_and_carried_fields_are_echoed() -> None:
    call = parse(
        body_with(
            metadata={"team": "a"},
            user="u1",
            safety_identifier="s1",
            prompt_cache_key="k",
            prompt_cache_retention="24h",
            service_tier="priority",
            max_tool_calls=3,
            background=False,
            top_logprobs=0,
            store=False,
            stream=True,
            stream_options={"include_obfuscation": False},
            previous_response_id="resp_x",
            include=sorted(
                [
                    "reasoning.encrypted_content",
                    "message.input_image.image_url",
                    "web_search_call.action.sources",
                    "file_search_call.results",
                ]
            ),
        )
    )
    assert (call.store, call.stream, call.previous_response_id) == (False, True, "resp_x")
    fields = call.echo.fields
    assert fields["metadata"] == {"team": "a"}
    assert (fields["user"], fields["safety_identifier"], fields["prompt_cache_key"]) == (
        "u1",
        "s1",
        "k",
    )
    assert (fields["prompt_cache_retention"], fields["max_tool_calls"]) == ("24h", 3)
    assert (fields["service_tier"], fields["background"], fields["store"]) == (
        "default",
        False,
        False,
    )
    assert fields["previous_response_id"] == "resp_x"
    req = call.chat_request()
    assert req.stream is True
    defaults = parse(body_with())
    assert (defaults.store, defaults.stream, defaults.echo.fields["metadata"]) == (True, False, {})


def test_truncation_auto_is_the_horde_context_fit() -> None:
    call = parse(body_with(truncation="auto", horde={"conformance": "best_effort"}))
    req = call.chat_request()
    assert (req.horde.context_fit, req.horde.conformance) == ("truncate_oldest", "best_effort")
    assert call.echo.fields["truncation"] == "auto"
    assert chat(body_with(truncation="disabled")).horde.context_fit == "none"
    assert parse(body_with()).echo.fields["truncation"] == "disabled"


@pytest.mark.parametrize(
    ("fields", "param", "rc"),
    [
        ({"truncation": "always"}, "truncation", RC.BadRequest),
        ({"truncation": "auto", "horde": {"context_fit": "none"}}, "truncation", RC.UnsupportedChatParameter),
        ({"truncation": "auto", "horde": 3}, "horde", RC.BadRequest),
        ({"horde": {"nope": 1}}, "horde.nope", RC.UnsupportedChatParameter),
        ({"conversation": "conv_1"}, "conversation", RC.UnsupportedChatParameter),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", RC.UnsupportedChatParameter),
        ({"context_management": [{"type": "compaction"}]}, "context_management", RC.UnsupportedChatParameter),
        ({"prompt_cache_options": {"mode": "explicit"}}, "prompt_cache_options", RC.UnsupportedChatParameter),
        ({"background": True}, "background", RC.UnsupportedChatParameter),
        ({"top_logprobs": 2}, "top_logprobs", RC.UnsupportedChatParameter),
        ({"seed": 1}, "seed", RC.UnsupportedChatParameter),
        ({"stream": "yes"}, "stream", RC.BadRequest),
        ({"store": 1}, "store", RC.BadRequest),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options", RC.ChatRequestInvalid),
        ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options.include_usage",
         RC.UnsupportedChatParameter),
        ({"stream": True, "stream_options": {"include_obfuscation": 1}}, "stream_options.include_obfuscation",
         RC.BadRequest),
        ({"stream": True, "stream_options": []}, "stream_options", RC.BadRequest),
        ({"include": "reasoning.encrypted_content"}, "include", RC.BadRequest),
        ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include[1]",
         RC.UnsupportedChatParameter),
        ({"include": ["everything"]}, "include[0]", RC.UnsupportedChatParameter),
        ({"metadata": ["a"]}, "metadata", RC.BadRequest),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", RC.BadRequest),
        ({"metadata": {"k" * 65: "v"}}, "metadata", RC.BadRequest),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", RC.BadRequest),
        ({"metadata": {"k": 1}}, "metadata.k", RC.BadRequest),
        ({"user": 1}, "user", RC.BadRequest),
        ({"safety_identifier": 1}, "safety_identifier", RC.BadRequest),
        ({"prompt_cache_key": {}}, "prompt_cache_key", RC.BadRequest),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention", RC.BadRequest),
        ({"max_tool_calls": -1}, "max_tool_calls", RC.BadRequest),
        ({"max_tool_calls": True}, "max_tool_calls", RC.BadRequest),
        ({"previous_response_id": 7}, "previous_response_id", RC.BadRequest),
        ({"model": None}, "model", RC.BadRequest),
    ],
)  # fmt: skip
def test_each_other_refusal_names_its_field(fields: dict[str, Any], param: str, rc: RC) -> None:
    exc = refusal(body_with(**fields))
    assert (exc.extra["param"], exc.rc) == (param, rc)


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert refusal([]).extra["param"] == "body"


def test_the_codex_body_is_served_under_best_effort() -> None:
    body = copy.deepcopy(CODEX_BODY)
    body["horde"] = {"conformance": "best_effort"}
    call = parse(body)
    req = call.chat_request()
    assert [m["role"] for m in req.messages] == ["system", "system", "system", "user", "user"]
    assert req.stream
    assert req.reasoning_effort is None
    assert req.parallel_tool_calls is False
    assert call.echo.dropped_tools == ({"param": "tools[2]", "type": "web_search"},)
    assert (call.store, call.echo.fields["prompt_cache_key"]) == (False, "019a-session")


def test_the_recorded_codex_request_is_refused_naming_web_search_and_served_without_it() -> None:
    recorded = json.loads(CODEX_RECORDING.read_text(encoding="utf-8"))["body"]
    web_search = next(i for i, tool in enumerate(recorded["tools"]) if tool["type"] == "web_search")
    exc = refusal(recorded)
    assert (exc.rc, exc.extra["param"]) == (
        RC.UnsupportedChatParameter,
        f"tools[{web_search}].type",
    )
    # What Codex sends with web_search = "disabled": served under strict.
    without = {**recorded, "tools": [t for t in recorded["tools"] if t["type"] != "web_search"]}
    call = parse(without)
    req = call.chat_request()
    assert req.horde.strict
    assert req.stream
    assert not call.store
    assert [m["role"] for m in req.messages] == ["system", "system", "user", "user"]
    namespaced = [name for name in call.echo.namespaced]
    assert namespaced
    assert all(name.startswith("multi_agent_v1__") for name in namespaced)
    # Under best_effort the recorded body is served, web_search dropped.
    call = parse({**recorded, "horde": {"conformance": "best_effort"}})
    assert call.echo.dropped_tools == ({"param": f"tools[{web_search}]", "type": "web_search"},)
    assert len(call.chat_request().tools or []) == len(req.tools or [])


# Ids and the echo's stored form ----------------------------------------------------------


def test_a_response_id_names_its_request() -> None:
    rid = str(uuid.uuid4())
    assert request_id_of(response_id(rid)) == rid
    for other in (rid, "resp_", "resp_x", None, 3, "msg_" + rid):
        assert request_id_of(other) is None


def test_the_echo_reads_back_what_it_stored() -> None:
    body = copy.deepcopy(CODEX_BODY)
    body["horde"] = {"conformance": "best_effort"}
    echo = parse(body).echo
    assert ResponsesEcho.from_json(echo.to_json()) == echo


# Any body ---------------------------------------------------------------------------------

# Every kind of item and field the parser reads, for random edits to reach.
RICH_BODY = {
    **CODEX_BODY,
    "input": [
        *CODEX_BODY["input"],
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png", "detail": "low"}]},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]},
        {"type": "function_call", "call_id": "c1", "name": "search", "namespace": "mcp__docs__", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "doc"}]},
    ],
    "tools": [*CODEX_BODY["tools"], WEATHER],
    "text": {"format": {"type": "json_schema", "name": "f", "schema": string_object(["a"], closed=True), "strict": True}},
    "reasoning": {"effort": "low", "summary": "auto"},
    "metadata": {"k": "v"},
    "truncation": "auto",
    "stream_options": {"include_obfuscation": False},
    "horde": {"conformance": "best_effort"},
    "tool_choice": {"type": "function", "name": "get_weather"},
    "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9,
    "user": "u", "safety_identifier": "s", "prompt_cache_retention": "24h", "service_tier": "flex",
    "max_tool_calls": 2, "previous_response_id": "resp_1", "client_metadata": {"session_id": "s1"},
}  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_field_replaced(RICH_BODY))
def test_any_value_in_any_field_is_accepted_or_refused_with_a_4xx(body: Any) -> None:
    assert_accepts_or_refuses_with_4xx(lambda b: parse_responses_request(b).chat_request(), body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(RICH_BODY))
def test_any_mutation_of_a_body_is_accepted_or_refused_with_a_4xx(body: Any) -> None:
    assert_accepts_or_refuses_with_4xx(lambda b: parse_responses_request(b).chat_request(), body)


def test_the_rich_body_is_served() -> None:
    # The base of the random edits above parses: they start from a valid body.
    assert chat(RICH_BODY).messages
