"""The chat reply contract: the structured submit, its verification, the job payload.

Rules come from the chat specification's conformance decision and from its
worker guide ("Serve chat jobs from a text worker"): steps 2, 4, 6, "Submit refusals" and 7. Requests are built
with parse_chat_request from OpenAI bodies a client would send; replies with
parse_chat_submit from bodies a worker would submit.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest

from hordelite.contract.chat_reply import (
    FAULT_REASONS,
    FINISH_REASONS,
    ChatReply,
    build_worker_chat_extras,
    is_chat_submit,
    output_estimate_chars,
    parse_chat_submit,
    verify_chat_reply,
)
from hordelite.contract.chat_request import (
    NEUTRAL_BACKEND_SAMPLERS,
    OPENAI_SAMPLING_DEFAULTS,
    ChatRequest,
    parse_chat_request,
)
from hordelite.contract.kudos import billed_tokens
from hordelite.contract.limits import (
    MAX_NATIVE_FINISH_REASON,
    MAX_REASONING_BYTES,
    MAX_REPORTED_TOKENS,
)
from hordelite.errors import RC, HordeError
from tests.chat_shapes import function_tool

JOB_ID = str(uuid.uuid4())
MODEL = "koboldcpp/Llama-3.1-8B-Instruct"
MODES = ["strict", "best_effort"]

WEATHER = function_tool("get_weather", "The current weather in a city.", strings=["city"])
TIME = function_tool("get_time", "The local time in a city.", strings=["city"])
FORECAST_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "temperature_c": {"type": "number"},
    },
    "required": ["city", "temperature_c"],
    "additionalProperties": False,
}


def chat_body(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "developer", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        **fields,
    }


def request(mode: str = "strict", **fields: Any) -> ChatRequest:
    horde = fields.pop("horde", {})
    return parse_chat_request(chat_body(horde={"conformance": mode, **horde}, **fields))


def with_tools(mode: str = "strict", **fields: Any) -> ChatRequest:
    return request(mode, tools=[WEATHER, TIME], **fields)


def json_schema(strict: bool, schema: Any = None) -> dict[str, Any]:
    spec = {"name": "forecast", "schema": FORECAST_SCHEMA if schema is None else schema}
    return {"type": "json_schema", "json_schema": {**spec, "strict": strict}}


def call(
    name: str = "get_weather", call_id: str = "call_1", arguments: str = '{"city": "Paris"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def submit_body(message: Any = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": JOB_ID,
        "message": {"role": "assistant", "content": "Blue."} if message is None else message,
        "finish_reason": "stop",
        "model_id": MODEL,
        "state": "ok",
        **fields,
    }
    return body


def reply(
    content: str | None = "Blue.", calls: list[dict[str, Any]] | None = None, **fields: Any
) -> ChatReply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        fields.setdefault("finish_reason", "tool_calls")
    parsed = parse_chat_submit(submit_body(message, **fields)).reply
    assert parsed is not None
    return parsed


def refusal_of(fn: Any, *args: Any) -> HordeError:
    with pytest.raises(HordeError) as info:
        fn(*args)
    return info.value


def assert_submit_invalid(error: HordeError, field: str) -> None:
    assert error.rc is RC.ChatSubmitInvalid, error
    assert error.status == 400
    assert list(error.extra["errors"]) == [field]
    assert field in error.message


def assert_nonconformant(error: HordeError, field: str) -> None:
    assert error.rc is RC.ChatSubmitNonconformant, error
    assert error.status == 400
    assert list(error.extra["errors"]) == [field]


# Recognising and parsing a submit ------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"id": JOB_ID, "state": "faulted", "model_id": MODEL},
        {"id": JOB_ID, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"},
    ],
    ids=["model_id", "message"],
)
def test_a_body_with_model_id_or_message_is_a_chat_submit(body: dict[str, Any]) -> None:
    assert is_chat_submit(body)


def test_a_text_submit_with_a_generation_is_not_a_chat_submit() -> None:
    assert not is_chat_submit({"id": JOB_ID, "generation": "Once upon a time", "state": "ok"})


def test_the_structured_submit_of_the_guide_is_parsed_into_its_reply() -> None:
    body = submit_body(prompt_tokens=21, completion_tokens=3, native_finish_reason="eos_token")
    submit = parse_chat_submit(body)
    assert (submit.id, submit.state, submit.model_id, submit.fault_reason) == (
        JOB_ID,
        "ok",
        MODEL,
        None,
    )
    assert submit.reply == ChatReply(
        content="Blue.",
        tool_calls=None,
        reasoning_content=None,
        finish_reason="stop",
        native_finish_reason="eos_token",
        prompt_tokens=21,
        completion_tokens=3,
        reasoning_tokens=None,
    )


def test_a_submit_id_that_is_not_a_uuid_is_refused_with_InvalidJobID() -> None:
    error = refusal_of(parse_chat_submit, submit_body(id="job-1"))
    assert error.rc is RC.InvalidJobID
    assert error.status == 404


def test_a_submit_without_an_id_is_refused_naming_id() -> None:
    body = submit_body()
    del body["id"]
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "id")


@pytest.mark.parametrize("state", ["done", "", 1])
def test_a_state_other_than_ok_censored_csam_or_faulted_is_refused(state: Any) -> None:
    assert_submit_invalid(refusal_of(parse_chat_submit, submit_body(state=state)), "state")


@pytest.mark.parametrize("message", [None, "Blue.", ["Blue."]], ids=["null", "string", "array"])
def test_a_submit_without_a_message_object_is_refused_naming_message(message: Any) -> None:
    body = submit_body()
    body["message"] = message
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message")


def test_a_chat_submit_sending_generation_in_place_of_message_is_refused() -> None:
    body = {"id": JOB_ID, "generation": "Blue.", "finish_reason": "stop", "model_id": MODEL}
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message")


@pytest.mark.parametrize("state", ["ok", "faulted"])
def test_a_submit_with_both_generation_and_message_is_refused(state: str) -> None:
    body = submit_body(generation="Blue.", state=state)
    error = refusal_of(parse_chat_submit, body)
    assert_submit_invalid(error, "message")
    assert "generation" in error.message


@pytest.mark.parametrize("role", ["user", "system", None])
def test_a_message_whose_role_is_not_assistant_is_refused(role: Any) -> None:
    body = submit_body({"role": role, "content": "Blue."})
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message.role")


@pytest.mark.parametrize("message", [{"role": "assistant", "content": None}, {"role": "assistant"}])
def test_a_null_content_is_refused_without_tool_calls(message: dict[str, Any]) -> None:
    assert_submit_invalid(refusal_of(parse_chat_submit, submit_body(message)), "message.content")


@pytest.mark.parametrize("content", [["Blue."], [{"type": "text", "text": "Blue."}], 3])
def test_a_content_that_is_not_a_string_is_refused(content: Any) -> None:
    body = submit_body({"role": "assistant", "content": content})
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message.content")


def test_an_empty_content_is_a_completed_reply() -> None:
    assert reply("").content == ""


def test_a_null_content_is_accepted_with_the_models_calls() -> None:
    parsed = reply(None, [call()])
    assert parsed.content is None
    assert parsed.tool_calls == [call()]
    assert parsed.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("broken", "field"),
    [
        (
            {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            "message.tool_calls[0].id",
        ),
        ({**call(), "id": ""}, "message.tool_calls[0].id"),
        ({**call(), "type": "code_interpreter"}, "message.tool_calls[0].type"),
        ({"id": "call_1", "type": "function"}, "message.tool_calls[0].function"),
        ({**call(), "function": {"arguments": "{}"}}, "message.tool_calls[0].function.name"),
        (
            {**call(), "function": {"name": "get_weather"}},
            "message.tool_calls[0].function.arguments",
        ),
        (
            {**call(), "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            "message.tool_calls[0].function.arguments",
        ),
        ("get_weather()", "message.tool_calls[0]"),
    ],
    ids=[
        "no-id",
        "empty-id",
        "type",
        "no-function",
        "no-name",
        "no-arguments",
        "object-arguments",
        "string",
    ],
)
def test_a_malformed_tool_call_is_refused_naming_its_field(broken: Any, field: str) -> None:
    body = submit_body(
        {"role": "assistant", "content": None, "tool_calls": [broken]}, finish_reason="tool_calls"
    )
    assert_submit_invalid(refusal_of(parse_chat_submit, body), field)


def test_tool_calls_that_are_not_an_array_are_refused() -> None:
    body = submit_body(
        {"role": "assistant", "content": None, "tool_calls": call()}, finish_reason="tool_calls"
    )
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message.tool_calls")


@pytest.mark.parametrize("finish_reason", [None, "eos_token", "function_call", 1])
def test_a_finish_reason_outside_stop_length_content_filter_and_tool_calls_is_refused(
    finish_reason: Any,
) -> None:
    body = submit_body(finish_reason=finish_reason)
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "finish_reason")


@pytest.mark.parametrize("finish_reason", FINISH_REASONS[:3])
def test_each_finish_reason_without_calls_but_tool_calls_is_accepted(finish_reason: str) -> None:
    assert reply(finish_reason=finish_reason).finish_reason == finish_reason


@pytest.mark.parametrize("calls", [None, []], ids=["absent", "empty"])
def test_finish_reason_tool_calls_without_calls_is_refused(calls: Any) -> None:
    body = submit_body(
        {"role": "assistant", "content": "", "tool_calls": calls}, finish_reason="tool_calls"
    )
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "finish_reason")


def test_a_native_finish_reason_over_32_characters_is_refused() -> None:
    longest = "x" * MAX_NATIVE_FINISH_REASON
    assert reply(native_finish_reason=longest).native_finish_reason == longest
    body = submit_body(native_finish_reason=longest + "x")
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "native_finish_reason")


def test_a_reasoning_content_over_1_MiB_of_utf8_is_refused() -> None:
    # "é" is two bytes of UTF-8: the bound is on bytes, not characters.
    at_limit = "é" * (MAX_REASONING_BYTES // 2)
    parsed = parse_chat_submit(
        submit_body({"role": "assistant", "content": "", "reasoning_content": at_limit})
    )
    assert parsed.reply is not None
    assert parsed.reply.reasoning_content == at_limit
    over = submit_body({"role": "assistant", "content": "", "reasoning_content": at_limit + "a"})
    assert_submit_invalid(refusal_of(parse_chat_submit, over), "message.reasoning_content")


def test_a_reasoning_content_that_is_not_a_string_is_refused() -> None:
    body = submit_body({"role": "assistant", "content": "", "reasoning_content": ["think"]})
    assert_submit_invalid(refusal_of(parse_chat_submit, body), "message.reasoning_content")


@pytest.mark.parametrize("key", ["prompt_tokens", "completion_tokens", "reasoning_tokens"])
@pytest.mark.parametrize("value", [-1, MAX_REPORTED_TOKENS + 1, 2.5, "21", True])
def test_a_token_count_that_is_not_an_integer_from_0_to_10_million_is_refused_naming_it(
    key: str, value: Any
) -> None:
    assert_submit_invalid(refusal_of(parse_chat_submit, submit_body(**{key: value})), key)


def test_reported_counts_are_kept_a_zero_included_and_a_missing_count_stays_null() -> None:
    parsed = reply(prompt_tokens=0, completion_tokens=MAX_REPORTED_TOKENS)
    assert (parsed.prompt_tokens, parsed.completion_tokens, parsed.reasoning_tokens) == (
        0,
        MAX_REPORTED_TOKENS,
        None,
    )


def test_a_faulted_submit_needs_neither_generation_nor_message() -> None:
    submit = parse_chat_submit({"id": JOB_ID, "state": "faulted", "model_id": MODEL})
    assert (submit.state, submit.reply, submit.fault_reason) == ("faulted", None, None)


@pytest.mark.parametrize("reason", sorted(FAULT_REASONS))
def test_a_known_fault_reason_is_kept(reason: str) -> None:
    body = {"id": JOB_ID, "state": "faulted", "model_id": MODEL, "fault_reason": reason}
    assert parse_chat_submit(body).fault_reason == reason


@pytest.mark.parametrize("reason", ["gpu_on_fire", "", 7, ["prompt_overflow"]])
def test_an_unknown_fault_reason_is_ignored_and_the_fault_accepted(reason: Any) -> None:
    body = {"id": JOB_ID, "state": "faulted", "model_id": MODEL, "fault_reason": reason}
    submit = parse_chat_submit(body)
    assert (submit.state, submit.fault_reason) == ("faulted", None)


def test_the_fault_reasons_a_worker_needs_each_have_their_own_sentence() -> None:
    needed = {
        "prompt_overflow",
        "reply_refused",
        "template_error",
        "backend_error",
        "unsupported_input",
    }
    assert needed <= FAULT_REASONS.keys()
    sentences = [FAULT_REASONS[r] for r in needed]
    assert len(set(sentences)) == len(sentences)
    assert "context" in FAULT_REASONS["prompt_overflow"]
    assert "template" in FAULT_REASONS["template_error"]


# The reply as the client sees it -------------------------------------------------------


def test_the_message_carries_tool_calls_and_reasoning_only_when_there_are_any() -> None:
    assert reply("Blue.").message() == {"role": "assistant", "content": "Blue."}
    thought = parse_chat_submit(
        submit_body(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call()],
                "reasoning_content": "Paris...",
            },
            finish_reason="tool_calls",
        )
    ).reply
    assert thought is not None
    assert thought.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call()],
        "reasoning_content": "Paris...",
    }


def test_a_reply_reads_back_from_its_stored_json() -> None:
    original = reply(
        None, [call(), call("get_time", "call_2")], prompt_tokens=30, reasoning_tokens=4
    )
    stored = json.loads(json.dumps(original.to_json()))
    assert ChatReply.from_json(stored) == original


# Verification under both modes -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_call_to_a_function_the_client_did_not_offer_is_refused_under_every_conformance_mode(
    mode: str,
) -> None:
    error = refusal_of(
        verify_chat_reply,
        with_tools(mode),
        reply(None, [call(), call("get_stock_price", "call_2")]),
    )
    assert_submit_invalid(error, "message.tool_calls[1].function.name")
    assert "get_stock_price" in error.message


@pytest.mark.parametrize("mode", MODES)
def test_a_call_in_a_reply_to_a_request_without_tools_is_refused_under_every_conformance_mode(
    mode: str,
) -> None:
    error = refusal_of(verify_chat_reply, request(mode), reply(None, [call()]))
    assert_submit_invalid(error, "message.tool_calls[0].function.name")


def test_a_call_is_checked_against_every_tool_the_client_offered_not_only_the_named_one() -> None:
    # Under a named choice the worker receives one tool; the check uses every tool offered.
    req = with_tools(
        "best_effort", tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    verified = verify_chat_reply(req, reply(None, [call("get_time")]))
    assert verified.tool_calls == [call("get_time")]


@pytest.mark.parametrize("mode", MODES)
def test_two_calls_sharing_an_id_are_refused_under_every_conformance_mode(mode: str) -> None:
    calls = [call("get_weather", "call_7"), call("get_time", "call_7")]
    error = refusal_of(verify_chat_reply, with_tools(mode), reply(None, calls))
    assert_submit_invalid(error, "message.tool_calls[1].id")
    assert "call_7" in error.message


# Verification under strict --------------------------------------------------------------------


def test_a_call_under_tool_choice_none_is_refused_as_nonconformant_under_strict() -> None:
    error = refusal_of(verify_chat_reply, with_tools(tool_choice="none"), reply(None, [call()]))
    assert_nonconformant(error, "message.tool_calls")
    assert "none" in error.message


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_reply_without_a_call_under_a_forced_tool_choice_is_refused_under_strict(
    tool_choice: Any,
) -> None:
    error = refusal_of(
        verify_chat_reply, with_tools(tool_choice=tool_choice), reply("It is sunny.")
    )
    assert_nonconformant(error, "message.tool_calls")


def test_a_call_to_another_function_than_the_named_one_is_refused_under_strict() -> None:
    req = with_tools(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    error = refusal_of(verify_chat_reply, req, reply(None, [call("get_time")]))
    assert_nonconformant(error, "message.tool_calls[0].function.name")
    assert "get_time" in error.message
    assert "get_weather" in error.message


@pytest.mark.parametrize(
    "content",
    ["Sunny, 21 degrees.", "[1, 2]", '"sunny"', "", '{"city": "Paris"', "NaN", '{"t": NaN}'],
    ids=["prose", "array", "string", "empty", "truncated", "nan", "nan-inside"],
)
def test_content_that_is_not_a_json_object_is_refused_under_json_object(content: str) -> None:
    error = refusal_of(
        verify_chat_reply, request(response_format={"type": "json_object"}), reply(content)
    )
    assert_nonconformant(error, "message.content")
    assert "json_object" in error.message


@pytest.mark.parametrize(
    "content",
    ["Sunny.", "[1, 2]"],
    ids=["prose", "array"],
)
def test_content_that_is_not_a_json_object_is_refused_under_a_non_strict_json_schema(
    content: str,
) -> None:
    error = refusal_of(
        verify_chat_reply, request(response_format=json_schema(strict=False)), reply(content)
    )
    assert_nonconformant(error, "message.content")


def test_a_non_strict_json_schema_needs_a_json_object_but_not_a_match() -> None:
    content = '{"weather": "sunny"}'  # misses the schema's required keys
    verified = verify_chat_reply(request(response_format=json_schema(strict=False)), reply(content))
    assert verified.content == content


def test_content_that_does_not_match_a_strict_schema_is_refused_naming_the_schema_path() -> None:
    req = request(response_format=json_schema(strict=True))
    error = refusal_of(verify_chat_reply, req, reply('{"city": "Paris", "temperature_c": "warm"}'))
    assert_nonconformant(error, "message.content")
    assert "$.temperature_c" in error.message
    assert "properties/temperature_c/type" in error.message
    assert "'forecast'" in error.message


def test_content_missing_a_required_property_of_a_strict_schema_is_refused() -> None:
    req = request(response_format=json_schema(strict=True))
    error = refusal_of(verify_chat_reply, req, reply('{"city": "Paris"}'))
    assert_nonconformant(error, "message.content")
    assert "temperature_c" in error.message


def test_content_that_is_not_json_is_refused_under_a_strict_schema() -> None:
    req = request(response_format=json_schema(strict=True))
    error = refusal_of(verify_chat_reply, req, reply("Paris, 21 degrees"))
    assert_nonconformant(error, "message.content")
    assert "not JSON" in error.message


def test_content_matching_a_strict_schema_is_accepted() -> None:
    content = '{"city": "Paris", "temperature_c": 21.5}'
    verified = verify_chat_reply(request(response_format=json_schema(strict=True)), reply(content))
    assert verified.content == content


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "("},
        {"type": "string", "minLength": "three"},
        {"$ref": "https://schemas.example.com/forecast.json"},
        {"$ref": "#/$defs/missing"},
        {"$ref": "#"},
    ],
    ids=["bad-regex", "bad-keyword", "remote-ref", "dangling-ref", "self-ref"],
)
def test_a_strict_schema_the_validator_cannot_apply_falls_back_to_requiring_a_json_object(
    schema: Any,
) -> None:
    # The client's schema proves nothing about the reply: the reply is held
    # to the non-strict rule (a JSON object), not refused for the client's
    # mistake, and the verification neither crashes nor fetches anything.
    req = request(response_format=json_schema(strict=True, schema=schema))
    assert verify_chat_reply(req, reply('{"any": 1}')).content == '{"any": 1}'
    assert_nonconformant(refusal_of(verify_chat_reply, req, reply("sunny")), "message.content")


@pytest.mark.parametrize("content", [None, ""], ids=["null", "empty"])
@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, json_schema(strict=True)],
    ids=["json_object", "strict-schema"],
)
def test_a_reply_that_only_calls_tools_is_not_checked_against_the_format(
    content: str | None, response_format: dict[str, Any]
) -> None:
    req = with_tools(response_format=response_format)
    verified = verify_chat_reply(req, reply(content, [call()]))
    assert verified.tool_calls == [call()]


def test_a_reply_with_calls_and_text_has_its_text_checked_against_the_format() -> None:
    req = with_tools(response_format={"type": "json_object"})
    error = refusal_of(verify_chat_reply, req, reply("Let me check.", [call()]))
    assert_nonconformant(error, "message.content")


def test_a_best_effort_reply_that_passes_the_shared_checks_is_delivered_as_submitted() -> None:
    cases = [
        (with_tools("best_effort", tool_choice="none"), reply(None, [call()])),
        (with_tools("best_effort", tool_choice="required"), reply("It is sunny.")),
        (request("best_effort", response_format={"type": "json_object"}), reply("not json")),
        (request("best_effort", response_format=json_schema(strict=True)), reply('{"city": 1}')),
        (
            with_tools("best_effort", parallel_tool_calls=False),
            reply(None, [call(), call("get_time", "call_2")]),
        ),
    ]
    for req, submitted in cases:
        assert verify_chat_reply(req, submitted) == submitted


def test_a_strict_single_call_request_keeps_only_the_first_of_several_calls() -> None:
    calls = [
        call("get_weather", "call_1"),
        call("get_time", "call_2"),
        call("get_weather", "call_3"),
    ]
    verified = verify_chat_reply(with_tools(parallel_tool_calls=False), reply(None, calls))
    assert verified.tool_calls == calls[:1]
    assert verified.finish_reason == "tool_calls"


def test_a_strict_request_allowing_parallel_calls_keeps_every_call() -> None:
    calls = [call("get_weather", "call_1"), call("get_time", "call_2")]
    assert verify_chat_reply(with_tools(), reply(None, calls)).tool_calls == calls


@pytest.mark.parametrize("mode", MODES)
def test_a_reply_to_a_named_function_is_stored_with_finish_reason_stop(mode: str) -> None:
    req = with_tools(mode, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    verified = verify_chat_reply(req, reply(None, [call()], finish_reason="tool_calls"))
    assert verified.finish_reason == "stop"
    assert verified.tool_calls == [call()]


def test_a_reply_to_required_keeps_finish_reason_tool_calls() -> None:
    verified = verify_chat_reply(with_tools(tool_choice="required"), reply(None, [call()]))
    assert verified.finish_reason == "tool_calls"


# Pricing -----------------------------------------------------------------------------------


def test_the_output_estimate_counts_content_reasoning_and_each_calls_name_and_arguments() -> None:
    content, reasoning = "Checking both.", "The user wants Paris."
    calls = [
        call("get_weather", "call_1", '{"city": "Paris"}'),
        call("get_time", "call_2", '{"city": "Lyon"}'),
    ]
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": calls,
        "reasoning_content": reasoning,
    }
    submitted = parse_chat_submit(submit_body(message, finish_reason="tool_calls")).reply
    assert submitted is not None
    expected = (
        len(content)
        + len(reasoning)
        + len("get_weather")
        + len('{"city": "Paris"}')
        + len("get_time")
        + len('{"city": "Lyon"}')
    )
    assert output_estimate_chars(submitted) == expected


def test_a_reply_whose_budget_went_to_reasoning_is_priced_on_its_reasoning() -> None:
    reasoning = "Let me think about the weather in Paris. " * 40
    cut = parse_chat_submit(
        submit_body(
            {"role": "assistant", "content": "", "reasoning_content": reasoning},
            finish_reason="length",
        )
    ).reply
    assert cut is not None
    max_length = 512
    assert billed_tokens(output_estimate_chars(cut), max_length) == min(
        max_length, max(20, math.ceil(len(reasoning) / 4))
    )


# The worker's payload --------------------------------------------------------------------------


def extras(req: ChatRequest, declared: frozenset[str] = frozenset(), **kw: Any) -> dict[str, Any]:
    return build_worker_chat_extras(req, declared, 512, 4096, **kw)


def test_every_sampling_field_reaches_the_worker_with_openai_defaults_where_the_client_left_one_out() -> (
    None
):
    payload = extras(request(temperature=0.5, presence_penalty=0.3))
    expected = {
        **OPENAI_SAMPLING_DEFAULTS,
        "temperature": 0.5,
        "presence_penalty": 0.3,
        **NEUTRAL_BACKEND_SAMPLERS,
    }
    assert {key: payload[key] for key in expected} == expected
    assert (payload["rep_pen"], payload["top_k"], payload["min_p"]) == (1.0, 0, 0.0)


def test_the_worker_receives_the_validated_budgets_one_choice_and_no_prompt() -> None:
    payload = build_worker_chat_extras(request(max_tokens=300), frozenset(), 300, 2048)
    assert (payload["max_length"], payload["max_context_length"], payload["n"]) == (300, 2048, 1)
    assert "prompt" not in payload


def test_a_developer_message_reaches_the_worker_as_a_system_message() -> None:
    payload = extras(request())
    assert payload["messages"][0] == {"role": "system", "content": "You are a terse assistant."}
    assert payload["messages"][1] == {"role": "user", "content": "What is the weather in Paris?"}


def test_stop_and_seed_reach_the_worker_only_when_the_client_sent_them() -> None:
    plain = extras(request())
    assert "stop_sequence" not in plain
    assert "seed" not in plain
    sent = extras(request(stop="\nuser:", seed=42))
    assert (sent["stop_sequence"], sent["seed"]) == (["\nuser:"], 42)


def test_a_seed_of_zero_reaches_the_worker() -> None:
    assert extras(request(seed=0))["seed"] == 0


def test_reasoning_effort_reaches_only_declaring_workers_as_medium_by_default() -> None:
    declaring = frozenset({"reasoning_effort", "seed"})
    assert "reasoning_effort" not in extras(request())
    assert "reasoning_effort" not in extras(request(reasoning_effort="high"), frozenset({"seed"}))
    assert extras(request(), declaring)["reasoning_effort"] == "medium"
    for effort in ("none", "minimal", "high"):
        assert extras(request(reasoning_effort=effort), declaring)["reasoning_effort"] == effort


def test_tool_choice_none_sends_no_tool_keys_to_the_worker() -> None:
    payload = extras(with_tools(tool_choice="none", parallel_tool_calls=False))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & payload.keys()


def test_a_request_without_tools_sends_no_tool_keys_to_the_worker() -> None:
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & extras(request()).keys()


def test_a_named_function_reaches_the_worker_alone_under_required() -> None:
    payload = extras(with_tools(tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert payload["tools"] == [TIME]
    assert payload["tool_choice"] == "required"


def test_tools_reach_the_worker_as_sent_with_the_tool_choice_the_client_sent() -> None:
    payload = extras(with_tools(tool_choice="auto"))
    assert (payload["tools"], payload["tool_choice"]) == ([WEATHER, TIME], "auto")
    assert "tool_choice" not in extras(with_tools())


def test_parallel_tool_calls_reaches_the_worker_only_when_the_client_set_it_false() -> None:
    assert "parallel_tool_calls" not in extras(with_tools())
    assert "parallel_tool_calls" not in extras(with_tools(parallel_tool_calls=True))
    assert extras(with_tools(parallel_tool_calls=False))["parallel_tool_calls"] is False


def test_response_format_reaches_the_worker_only_when_it_is_not_text() -> None:
    assert "response_format" not in extras(request(response_format={"type": "text"}))
    assert extras(request(response_format={"type": "json_object"}))["response_format"] == {
        "type": "json_object"
    }
    sent = json_schema(strict=True)
    assert extras(request(response_format=sent))["response_format"] == sent


def test_stream_progress_reaches_the_worker_only_when_the_client_streams() -> None:
    assert "stream_progress" not in extras(request())
    assert "stream_progress" not in extras(request(), stream_progress=False)
    assert extras(request(stream=True), stream_progress=True)["stream_progress"] is True


def test_changing_a_payload_leaves_the_stored_request_unchanged() -> None:
    req = with_tools(response_format={"type": "json_object"})
    before = req.to_json()
    payload = extras(req)
    payload["messages"][0]["content"] = "rewritten"
    payload["tools"][0]["function"]["name"] = "rewritten"
    assert req.to_json() == before
