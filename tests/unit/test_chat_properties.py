"""Properties of the chat contract over random input.

Whatever JSON a client or a worker sends, the parsers and the verification
either accept it or refuse it with a HordeError carrying a 4xx status: they
never crash. Random bodies come from a recursive strategy of JSON values and
from mutations of realistic bodies (a key replaced by a random value, removed,
or a random key added), so the search reaches the nested checks.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hordelite.contract.chat_reply import (
    FINISH_REASONS,
    build_worker_chat_extras,
    parse_chat_submit,
    verify_chat_reply,
)
from hordelite.contract.chat_request import ChatRequest, parse_chat_request
from hordelite.errors import HordeError
from tests.chat_shapes import calling, json_schema_format, tool_call

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JOB_ID = str(uuid.UUID(int=7))
# Keys the parsers read, so that random objects reach their checks.
KEYS = st.sampled_from(
    """role content tool_calls tool_call_id name type function arguments id text image_url
    url detail parameters strict schema json_schema tools tool_choice parallel_tool_calls
    response_format horde conformance workers messages model models stop seed max_tokens
    max_completion_tokens temperature top_p presence_penalty frequency_penalty stream
    stream_options include_usage reasoning_effort max_kudos properties required
    additionalProperties message finish_reason generation state model_id fault_reason
    reasoning_content prompt_tokens completion_tokens native_finish_reason""".split()
) | st.text(max_size=8)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63, -(2**63) - 1, 10**400, -(10**400)])
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        ["none", "auto", "required", "function", "assistant", "tool", "strict", "", "{}"]
    )
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}

CHAT_BODY: dict[str, Any] = {
    "model": "koboldcpp/Llama-3.1-8B-Instruct",
    "messages": [
        {"role": "developer", "content": "You are a terse assistant."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture, and the weather?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/a.jpg", "detail": "low"},
                },
            ],
        },
        calling(tool_call("call_1", "get_weather")),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "tools": [WEATHER, TIME],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": False,
    "response_format": json_schema_format("forecast", ["city"]),
    "temperature": 0.7,
    "max_tokens": 256,
    "stop": ["\nuser:"],
    "seed": 42,
    "reasoning_effort": "low",
    "stream": True,
    "stream_options": {"include_usage": True},
    "horde": {"conformance": "strict", "workers": [str(uuid.UUID(int=1))], "max_kudos": 50},
}

SUBMIT_BODY: dict[str, Any] = {
    "id": JOB_ID,
    "message": {
        "role": "assistant",
        "content": '{"city": "Paris"}',
        "reasoning_content": "The user asks about Paris.",
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    "finish_reason": "tool_calls",
    "native_finish_reason": "eos_token",
    "prompt_tokens": 21,
    "completion_tokens": 3,
    "reasoning_tokens": 1,
    "model_id": "koboldcpp/Llama-3.1-8B-Instruct",
    "state": "ok",
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every container path in a JSON value (the root included)."""
    found = [prefix] if isinstance(value, dict | list) else []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        found += _paths(child, (*prefix, key))
    return found


def _fields(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a JSON value, to leaves and to containers."""
    found: list[tuple[Any, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        found += [(*prefix, key), *_fields(child, (*prefix, key))]
    return found


@st.composite
def one_field_replaced(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with one field, chosen uniformly, holding a random JSON value."""
    body = json.loads(json.dumps(base))
    *parent, key = draw(st.sampled_from(_fields(body)))
    _at(body, tuple(parent))[key] = draw(JSON)
    return body


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with one to three random edits somewhere inside it."""
    body = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        container = _at(body, draw(st.sampled_from(_paths(body))))
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "add" or not keys:
            if isinstance(container, dict):
                container[draw(KEYS)] = draw(JSON)
            else:
                container.append(draw(JSON))
        elif action == "remove":
            del container[draw(st.sampled_from(keys))]
        else:
            container[draw(st.sampled_from(keys))] = draw(JSON)
    return body


def assert_accepts_or_refuses_with_4xx(fn: Callable[[Any], Any], body: Any) -> Any:
    refusal: HordeError | None = None
    try:
        return fn(body)
    except HordeError as error:
        refusal = error
    assert refusal is not None
    assert 400 <= refusal.status < 500, refusal
    return None


# parse_chat_request ---------------------------------------------------------------------


@EXAMPLES
@given(JSON)
def test_any_json_body_is_accepted_or_refused_with_a_4xx_by_parse_chat_request(body: Any) -> None:
    assert_accepts_or_refuses_with_4xx(parse_chat_request, body)


@EXAMPLES
@given(mutated(CHAT_BODY))
def test_any_mutation_of_a_chat_body_is_accepted_or_refused_with_a_4xx(body: Any) -> None:
    req = assert_accepts_or_refuses_with_4xx(parse_chat_request, body)
    if req is not None:
        # A request that parses has a payload for any worker, as JSON.
        payload = build_worker_chat_extras(req, frozenset({"reasoning_effort"}), 256, 4096)
        json.dumps(payload)
        if req.tool_choice == "none":
            assert not {"tools", "tool_choice", "parallel_tool_calls"} & payload.keys()
        # Compared as JSON: a NaN inside a tool schema is not equal to itself.
        stored = json.dumps(req.to_json())
        assert json.dumps(ChatRequest.from_json(json.loads(stored)).to_json()) == stored


@settings(max_examples=300, deadline=None)
@given(one_field_replaced(CHAT_BODY))
def test_any_value_in_any_field_of_a_chat_body_is_accepted_or_refused_with_a_4xx(body: Any) -> None:
    assert_accepts_or_refuses_with_4xx(parse_chat_request, body)


NUMBERS = (
    st.integers()
    | st.floats()
    | st.sampled_from([2**63, -(2**63) - 1, 10**400, -(10**400), 1e308, -0.0])
)


@EXAMPLES
@given(
    st.sampled_from(
        [
            ("temperature",),
            ("top_p",),
            ("frequency_penalty",),
            ("presence_penalty",),
            ("max_tokens",),
            ("max_completion_tokens",),
            ("seed",),
            ("horde", "max_kudos"),
        ]
    ),
    NUMBERS,
)
def test_any_number_in_a_numeric_field_of_a_chat_body_is_accepted_or_refused_with_a_4xx(
    path: tuple[str, ...], number: Any
) -> None:
    body = json.loads(json.dumps(CHAT_BODY))
    *parent, key = path
    _at(body, tuple(parent))[key] = number
    assert_accepts_or_refuses_with_4xx(parse_chat_request, body)


# parse_chat_submit ----------------------------------------------------------------------------


@EXAMPLES
@given(JSON)
def test_any_json_body_is_accepted_or_refused_with_a_4xx_by_parse_chat_submit(body: Any) -> None:
    assert_accepts_or_refuses_with_4xx(parse_chat_submit, body)


@EXAMPLES
@given(mutated(SUBMIT_BODY))
def test_any_mutation_of_a_chat_submit_is_accepted_or_refused_with_a_4xx(body: Any) -> None:
    submit = assert_accepts_or_refuses_with_4xx(parse_chat_submit, body)
    if submit is not None and submit.reply is not None:
        assert submit.reply.finish_reason in FINISH_REASONS
        json.dumps(submit.reply.message())


@EXAMPLES
@given(one_field_replaced(SUBMIT_BODY))
def test_any_value_in_any_field_of_a_chat_submit_is_accepted_or_refused_with_a_4xx(
    body: Any,
) -> None:
    assert_accepts_or_refuses_with_4xx(parse_chat_submit, body)


@EXAMPLES
@given(st.sampled_from(["prompt_tokens", "completion_tokens", "reasoning_tokens"]), NUMBERS)
def test_any_number_as_a_token_count_is_accepted_or_refused_with_a_4xx(
    key: str, number: Any
) -> None:
    assert_accepts_or_refuses_with_4xx(parse_chat_submit, {**SUBMIT_BODY, key: number})


# verify_chat_reply ------------------------------------------------------------------------------

NAMES = st.sampled_from(["get_weather", "get_time", "get_stock_price"])
SCHEMA_KEYS = st.sampled_from(
    """type pattern minimum maxLength enum const items anyOf $ref $defs format properties
    required additionalProperties""".split()
)
OBJECT_SCHEMAS = st.fixed_dictionaries(
    {"type": st.just("object"), "additionalProperties": st.just(False)},
    optional={key: SCALARS | JSON for key in ("properties", "required", "$defs", "items")},
)
SCHEMAS = OBJECT_SCHEMAS | st.recursive(
    st.dictionaries(SCHEMA_KEYS, SCALARS, max_size=3),
    lambda children: st.dictionaries(
        SCHEMA_KEYS, children | st.lists(children, max_size=2), max_size=3
    ),
    max_leaves=8,
)


@st.composite
def chat_requests(draw: st.DrawFn) -> ChatRequest:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris, as JSON?"}],
        "horde": {"conformance": draw(st.sampled_from(["strict", "best_effort"]))},
    }
    if draw(st.booleans()):
        body["tools"] = [WEATHER, TIME]
        body["tool_choice"] = draw(
            st.sampled_from([None, "none", "auto", "required"])
            | NAMES.filter(lambda n: n != "get_stock_price").map(
                lambda n: {"type": "function", "function": {"name": n}}
            )
        )
        body["parallel_tool_calls"] = draw(st.sampled_from([None, True, False]))
    body["response_format"] = draw(
        st.sampled_from([None, {"type": "text"}, {"type": "json_object"}])
        | st.builds(
            lambda strict, schema: {
                "type": "json_schema",
                "json_schema": {"name": "forecast", "strict": strict, "schema": schema},
            },
            st.booleans(),
            SCHEMAS,
        )
    )
    try:
        return parse_chat_request(body)
    except HordeError:
        # A random schema OpenAI's strict rules refuse: use no format instead.
        body["response_format"] = None
        return parse_chat_request(body)


@st.composite
def submits(draw: st.DrawFn) -> dict[str, Any]:
    calls = [
        {
            "id": draw(st.sampled_from(["call_1", "call_2", "call_3"])),
            "type": "function",
            "function": {"name": draw(NAMES), "arguments": draw(st.text(max_size=20))},
        }
        for _ in range(draw(st.integers(0, 3)))
    ]
    content = draw(st.none() | st.text(max_size=20) | JSON.map(json.dumps))
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": JOB_ID,
        "message": message,
        "finish_reason": draw(st.sampled_from(FINISH_REASONS)),
        "model_id": "m",
    }


@EXAMPLES
@given(SCHEMAS, st.booleans(), st.text(max_size=20) | JSON.map(json.dumps))
def test_any_json_schema_is_accepted_or_refused_with_a_4xx_and_any_reply_verified_against_it(
    schema: Any, strict: bool, content: str
) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris, as JSON?"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "forecast", "strict": strict, "schema": schema},
        },
    }
    req = assert_accepts_or_refuses_with_4xx(parse_chat_request, body)
    if req is not None:
        submit = parse_chat_submit(
            {
                **SUBMIT_BODY,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        )
        assert_accepts_or_refuses_with_4xx(lambda r: verify_chat_reply(req, r), submit.reply)


@EXAMPLES
@given(chat_requests(), submits())
def test_verification_accepts_or_refuses_any_parsed_reply_with_a_4xx(
    req: ChatRequest, body: dict[str, Any]
) -> None:
    submit = assert_accepts_or_refuses_with_4xx(parse_chat_submit, body)
    if submit is None:
        return
    verified = assert_accepts_or_refuses_with_4xx(lambda r: verify_chat_reply(req, r), submit.reply)
    if verified is not None:
        assert verified.finish_reason in FINISH_REASONS
        offered = {t["function"]["name"] for t in req.tools or ()}
        assert {c["function"]["name"] for c in verified.tool_calls or ()} <= offered
        if req.horde.strict and not req.parallel_tool_calls:
            assert len(verified.tool_calls or ()) <= 1
