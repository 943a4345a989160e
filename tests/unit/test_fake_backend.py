"""The fake OpenAI-compatible backend of hordelite.testing, over real HTTP.

Expected values come from the arithmetic its module docstring documents:
``ceil(utf8 bytes / 4)`` tokens, a fixed template part of ``template_overhead``
tokens, one completion token per whitespace-separated word.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import jsonschema
import pytest

from hordelite.testing import FakeBackend, FakeBackendConfig, open_fake_backend
from tests.chat_shapes import calling, tool_call

pytestmark = pytest.mark.anyio

Client = tuple[FakeBackend, httpx.AsyncClient]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
                "verbose": {"type": "boolean"},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@contextlib.asynccontextmanager
async def running(**config: Any) -> AsyncIterator[Client]:
    async with (
        open_fake_backend(FakeBackendConfig(**config)) as backend,
        httpx.AsyncClient(base_url=backend.url) as client,
    ):
        yield backend, client


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def tokens_of(text: str) -> int:
    """The documented fake tokenizer: one token per started 4 bytes of UTF-8."""
    return math.ceil(len(text.encode()) / 4)


async def chat(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def stream(client: httpx.AsyncClient, path: str, **body: Any) -> list[Any]:
    """The decoded ``data:`` events of a streamed answer; ``[DONE]`` as the string."""
    r = await client.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


async def counted(client: httpx.AsyncClient, messages: list[dict[str, Any]]) -> int:
    """What an exact counter counts: llama.cpp's /apply-template, then /tokenize."""
    prompt = (await client.post("/apply-template", json={"messages": messages})).json()["prompt"]
    return len((await client.post("/tokenize", json={"content": prompt})).json()["tokens"])


# Discovery routes.


async def test_the_model_routes_report_the_configured_model_and_context() -> None:
    async with running(model="tiny-llm", context=2048) as (_, client):
        models = (await client.get("/v1/models")).json()
        props = (await client.get("/props")).json()
        health = await client.get("/health")
    assert models == {
        "object": "list",
        "data": [{"id": "tiny-llm", "object": "model", "max_model_len": 2048}],
    }
    assert props["n_ctx"] == 2048
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert health.status_code == 200


# The counter arithmetic.


@pytest.mark.parametrize("text", ["", "abc", "abcd", "abcde", "héllo wörld", "日本語のテキスト"])
async def test_tokenize_counts_one_token_per_started_four_utf8_bytes(text: str) -> None:
    async with running() as (_, client):
        r = await client.post("/tokenize", json={"content": text})
    assert len(r.json()["tokens"]) == tokens_of(text)


async def test_tokenize_undercounts_by_the_configured_tokens_but_never_below_zero() -> None:
    text = "x" * 40  # ten tokens
    async with running(undercount=3) as (_, client):
        short = (await client.post("/tokenize", json={"content": text})).json()["tokens"]
        tiny = (await client.post("/tokenize", json={"content": "ab"})).json()["tokens"]
    assert len(short) == tokens_of(text) - 3
    assert tiny == []


async def test_apply_template_renders_every_message_after_a_fixed_part_of_the_overhead() -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
    ]
    async with running(template_overhead=5) as (_, client):
        prompt = (await client.post("/apply-template", json={"messages": messages})).json()[
            "prompt"
        ]
    body = prompt[4 * 5 :]
    assert body.index("Be terse.") < body.index("Name a colour.")
    assert "system" in body
    assert "user" in body


async def test_prompt_tokens_carry_the_template_overhead_on_top_of_the_messages() -> None:
    messages = user("How far is the moon?")
    async with running(template_overhead=0) as (_, client):
        bare = (await chat(client, messages=messages))["usage"]["prompt_tokens"]
    async with running(template_overhead=37) as (_, client):
        padded = (await chat(client, messages=messages))["usage"]["prompt_tokens"]
    assert padded - bare == 37


async def test_an_exact_counter_that_does_not_undercount_matches_prompt_tokens() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about ünïcode and 日本."},
    ]
    async with running(undercount=0) as (_, client):
        answer = await chat(client, messages=messages)
        count = await counted(client, messages)
    assert count == answer["usage"]["prompt_tokens"]


@pytest.mark.parametrize("undercount", [1, 7])
async def test_an_undercounting_counter_is_short_of_prompt_tokens_by_the_undercount(
    undercount: int,
) -> None:
    messages = user("A probe conversation, long enough to count.")
    async with running(undercount=undercount) as (_, client):
        answer = await chat(client, messages=messages)
        count = await counted(client, messages)
    assert answer["usage"]["prompt_tokens"] - count == undercount


CONVERSATIONS = [
    user(""),
    user("hi"),
    user("ünïcödé 日本語 " * 20),
    [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "call get_time"},
        calling(tool_call("call_9", "get_time")),
        {"role": "tool", "tool_call_id": "call_9", "content": "12:00"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
async def test_the_byte_bound_plus_the_probe_measured_overhead_covers_prompt_tokens(
    messages: list[dict[str, Any]],
) -> None:
    async with running(template_overhead=1000) as (_, client):
        probe = (await chat(client, messages=user("probe")))["usage"]["prompt_tokens"]
        actual = (await chat(client, messages=messages))["usage"]["prompt_tokens"]
    byte_bound = len(json.dumps(messages).encode())
    assert byte_bound + probe >= actual


async def test_the_byte_bound_alone_falls_short_of_a_large_template_overhead() -> None:
    messages = user("hi")
    async with running(template_overhead=1000) as (_, client):
        actual = (await chat(client, messages=messages))["usage"]["prompt_tokens"]
    assert len(json.dumps(messages).encode()) < actual


async def test_the_counter_routes_answer_404_on_a_backend_without_a_counter() -> None:
    async with running(counter=False) as (_, client):
        tokenize = await client.post("/tokenize", json={"content": "abc"})
        template = await client.post("/apply-template", json={"messages": user("a")})
        completion = await client.post("/v1/chat/completions", json={"messages": user("a")})
    assert tokenize.status_code == 404
    assert template.status_code == 404
    assert completion.status_code == 200


# Chat replies.


async def test_a_chat_reply_echoes_the_last_user_text_and_counts_its_words() -> None:
    messages = [*user("first question"), {"role": "assistant", "content": "ok"}]
    messages += user("hello there world")
    async with running() as (backend, client):
        answer = await chat(client, messages=messages, temperature=0.3)
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "echo: hello there world"}
    assert choice["finish_reason"] == "stop"
    assert answer["model"] == "fake-model"
    usage = answer["usage"]
    assert usage["completion_tokens"] == len("echo: hello there world".split())
    assert usage["prompt_tokens"] == backend.prompt_tokens(messages)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_reply_longer_than_max_tokens_is_cut_there_with_finish_reason_length(
    field: str,
) -> None:
    async with running() as (_, client):
        answer = await chat(client, messages=user("one two three four"), **{field: 3})
    assert answer["choices"][0]["message"]["content"] == "echo: one two"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3


async def test_a_reply_of_exactly_max_tokens_finishes_with_stop() -> None:
    async with running() as (_, client):
        answer = await chat(client, messages=user("one two"), max_tokens=3)
    assert answer["choices"][0]["message"]["content"] == "echo: one two"
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_reasoning_opens_the_reply_with_a_closed_think_block_that_counts_as_tokens() -> None:
    async with running(reasoning="Let me think.") as (_, client):
        answer = await chat(client, messages=user("hi"))
    content = answer["choices"][0]["message"]["content"]
    assert content == "<think>Let me think.</think>echo: hi"
    # <think>, three words, </think>, then the two words of the answer.
    assert answer["usage"]["completion_tokens"] == 1 + 3 + 1 + 2


async def test_max_tokens_inside_the_reasoning_leaves_the_think_block_unclosed() -> None:
    async with running(reasoning="one two three") as (_, client):
        answer = await chat(client, messages=user("hi"), max_tokens=3)
    assert answer["choices"][0]["message"]["content"] == "<think>one two"
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_a_conversation_that_does_not_fit_the_context_is_refused_with_400() -> None:
    messages = user("x" * 400)
    async with running(context=200) as (backend, client):
        prompt_tokens = backend.prompt_tokens(messages)
        fits = await client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 200 - prompt_tokens}
        )
        overflows = await client.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 201 - prompt_tokens},
        )
    assert fits.status_code == 200
    assert overflows.status_code == 400
    assert overflows.json()["error"]["code"] == "context_length_exceeded"


async def test_a_llamacpp_style_backend_refuses_an_overflow_as_llama_servers_does() -> None:
    async with running(context=200, overflow_error="llamacpp") as (_, client):
        r = await client.post("/v1/completions", json={"prompt": "x" * 800, "max_tokens": 10})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("exceed_context_size_error", 400)
    assert "exceeds the available context size" in error["message"]


# Tool calls.


async def test_a_tool_named_in_the_last_user_text_is_called_with_its_required_arguments() -> None:
    async with running() as (_, client):
        answer = await chat(
            client, messages=user("Please call get_weather for me."), tools=[WEATHER, CLOCK]
        )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    parameters = WEATHER["function"]["parameters"]  # type: ignore[index]
    jsonschema.validate(arguments, parameters)
    assert set(arguments) == set(parameters["required"])


async def test_a_tool_without_parameters_is_called_with_empty_arguments() -> None:
    async with running() as (_, client):
        answer = await chat(client, messages=user("call get_time"), tools=[WEATHER, CLOCK])
    [call] = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": "{}"}


async def test_each_mentioned_tool_is_called_in_order_with_distinct_ids() -> None:
    async with running() as (_, client):
        answer = await chat(
            client, messages=user("call get_time then call get_weather"), tools=[WEATHER, CLOCK]
        )
        again = await chat(client, messages=user("call get_time"), tools=[CLOCK])
    calls = (
        answer["choices"][0]["message"]["tool_calls"] + again["choices"][0]["message"]["tool_calls"]
    )
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather", "get_time"]
    assert len({c["id"] for c in calls}) == 3


async def test_parallel_tool_calls_false_keeps_only_the_first_call() -> None:
    async with running() as (_, client):
        answer = await chat(
            client,
            messages=user("call get_time then call get_weather"),
            tools=[WEATHER, CLOCK],
            parallel_tool_calls=False,
        )
    calls = answer["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]


@pytest.mark.parametrize(
    ("tool_choice", "text", "called"),
    [
        ("none", "call get_weather", None),
        ("auto", "what time is it?", None),
        ("required", "what time is it?", "get_weather"),
        ("required", "call get_time", "get_time"),
        ({"type": "function", "function": {"name": "get_time"}}, "call get_weather", "get_time"),
    ],
)
async def test_tool_choice_decides_whether_and_which_tool_is_called(
    tool_choice: Any, text: str, called: str | None
) -> None:
    async with running() as (_, client):
        answer = await chat(
            client, messages=user(text), tools=[WEATHER, CLOCK], tool_choice=tool_choice
        )
    choice = answer["choices"][0]
    if called is None:
        assert "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == f"echo: {text}"
        assert choice["finish_reason"] == "stop"
    else:
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == [called]
        assert choice["finish_reason"] == "tool_calls"


async def test_a_mentioned_function_that_is_not_offered_is_not_called() -> None:
    async with running() as (_, client):
        answer = await chat(client, messages=user("call launch_rockets"), tools=[CLOCK])
    assert answer["choices"][0]["message"]["content"] == "echo: call launch_rockets"


async def test_once_the_tool_result_follows_the_users_text_the_reply_is_text_not_the_call_again() -> (
    None
):
    # An agent sends the whole conversation back with each call's result:
    # calling again whenever the user's text says "call get_time" would
    # never let its loop end.
    asked = user("call get_time")
    answered = [
        *asked,
        calling(tool_call("call_1", "get_time")),
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    async with running() as (_, client):
        first = await chat(client, messages=asked, tools=[CLOCK])
        then = await chat(client, messages=answered, tools=[CLOCK])
        again = await chat(client, messages=[*answered, *user("call get_time")], tools=[CLOCK])
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert then["choices"][0]["finish_reason"] == "stop"
    assert then["choices"][0]["message"] == {"role": "assistant", "content": "echo: call get_time"}
    # A new user text asking again is a new request: the tool is called again.
    assert again["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"


# Structured output.


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "exclusiveMinimum": 0.5},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "owner": {"$ref": "#/$defs/person"},
        "nickname": {"type": ["string", "null"]},
        "either": {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
        "optional": {"type": "string"},
    },
    "required": ["name", "age", "score", "kind", "tags", "owner", "nickname", "either"],
    "additionalProperties": False,
    "$defs": {
        "person": {
            "type": "object",
            "properties": {"alive": {"type": "boolean"}},
            "required": ["alive"],
            "additionalProperties": False,
        }
    },
}


async def test_a_json_schema_reply_is_an_instance_of_the_schema() -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "pet", "strict": True, "schema": SCHEMA},
    }
    async with running() as (_, client):
        answer = await chat(client, messages=user("a pet"), response_format=response_format)
    content = json.loads(answer["choices"][0]["message"]["content"])
    jsonschema.validate(content, SCHEMA)
    assert "optional" not in content
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_a_json_object_reply_is_an_empty_object() -> None:
    async with running() as (_, client):
        answer = await chat(
            client, messages=user("json please"), response_format={"type": "json_object"}
        )
    assert json.loads(answer["choices"][0]["message"]["content"]) == {}


# Streaming.


def content_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if e != "[DONE]" and e["choices"]
    )


async def test_a_streamed_chat_reply_carries_the_same_content_token_by_token() -> None:
    async with running(reasoning="mull it over") as (_, client):
        whole = await chat(client, messages=user("hello world"))
        events = await stream(client, "/v1/chat/completions", messages=user("hello world"))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert deltas == ["<think>", "mull", " it", " over", "</think>", "echo:", " hello", " world"]
    assert content_of(events) == whole["choices"][0]["message"]["content"]
    finishing = chunks[-1]
    assert finishing["choices"][0]["finish_reason"] == "stop"
    assert finishing["usage"] == whole["usage"]


async def test_include_usage_sends_the_usage_in_a_last_chunk_without_choices() -> None:
    async with running() as (_, client):
        events = await stream(
            client,
            "/v1/chat/completions",
            messages=user("hi"),
            stream_options={"include_usage": True},
        )
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "usage" not in chunks[-1]


async def test_a_streamed_tool_call_arrives_whole_and_finishes_with_tool_calls() -> None:
    async with running() as (_, client):
        events = await stream(
            client, "/v1/chat/completions", messages=user("call get_weather"), tools=[WEATHER]
        )
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    [call] = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert call["index"] == 0
    assert call["function"]["name"] == "get_weather"
    parameters = WEATHER["function"]["parameters"]  # type: ignore[index]
    jsonschema.validate(json.loads(call["function"]["arguments"]), parameters)
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_usage_is_left_out_everywhere_when_report_usage_is_off() -> None:
    async with running(report_usage=False) as (_, client):
        whole = await chat(client, messages=user("hi"))
        events = await stream(
            client,
            "/v1/chat/completions",
            messages=user("hi"),
            stream_options={"include_usage": True},
        )
        text = (await client.post("/v1/completions", json={"prompt": "hi"})).json()
    assert "usage" not in whole
    assert "usage" not in text
    assert all("usage" not in e for e in events if e != "[DONE]")
    assert all(e["choices"] for e in events if e != "[DONE]")


# Text completions.


async def test_a_text_completion_echoes_the_prompt_whole_and_streamed() -> None:
    async with running() as (_, client):
        whole = (
            await client.post("/v1/completions", json={"prompt": "Once upon a", "max_tokens": 3})
        ).json()
        events = await stream(client, "/v1/completions", prompt="Once upon a", max_tokens=3)
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "echo: Once upon"
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["prompt_tokens"] == tokens_of("Once upon a")
    assert whole["usage"]["completion_tokens"] == 3
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "echo: Once upon"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_detokenize_joins_the_pieces_tokenize_made() -> None:
    text = "Once upon a time, déjà vu 🙂."
    async with running() as (backend, client):
        ids = (await client.post("/tokenize", json={"content": text})).json()["tokens"]
        whole = (await client.post("/detokenize", json={"tokens": ids})).json()
        tail = (await client.post("/detokenize", json={"tokens": ids[-2:]})).json()
        bad = await client.post("/detokenize", json={"tokens": ["a"]})
    assert whole == {"content": text}
    assert text.encode().endswith(tail["content"].encode())
    assert tail["content"] == backend.detokenize(ids[-2:])
    assert bad.status_code == 400


async def test_a_text_completion_of_token_ids_counts_them_and_echoes_their_text() -> None:
    async with running(context=20) as (backend, client):
        ids = backend.tokenize("Once upon a time there")  # 22 bytes: 6 tokens
        whole = await client.post("/v1/completions", json={"prompt": ids, "max_tokens": 14})
        over = await client.post("/v1/completions", json={"prompt": ids, "max_tokens": 15})
    assert len(ids) == 6
    assert whole.status_code == 200, whole.text
    assert whole.json()["usage"]["prompt_tokens"] == 6
    assert whole.json()["choices"][0]["text"] == "echo: Once upon a time there"
    assert over.status_code == 400


# Run-time knobs, the request log, determinism.


async def test_fail_answers_503_to_every_route_until_it_is_cleared() -> None:
    async with running() as (backend, client):
        backend.config.fail = True
        failing = [
            await client.get("/health"),
            await client.get("/v1/models"),
            await client.post("/v1/chat/completions", json={"messages": user("hi")}),
            await client.post("/v1/completions", json={"prompt": "hi"}),
            await client.post("/tokenize", json={"content": "hi"}),
        ]
        backend.config.fail = False
        recovered = await client.post("/v1/chat/completions", json={"messages": user("hi")})
    assert [r.status_code for r in failing] == [503] * len(failing)
    assert recovered.status_code == 200


async def test_an_outage_cuts_a_stream_in_flight_without_a_finish_or_done() -> None:
    body = {"messages": user(" ".join(["word"] * 30)), "stream": True}
    lines: list[str] = []
    async with (
        running(delay=0.05) as (backend, client),
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            lines.append(line)
            if '"content": "echo:"' in line:
                backend.config.fail = True
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert "data: [DONE]" not in lines
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    assert len(events) < 1 + 31


async def test_a_delay_holds_a_whole_answer_and_paces_each_streamed_token() -> None:
    async with running(delay=0.1) as (_, client):
        started = time.monotonic()
        await chat(client, messages=user("hi"))
        whole = time.monotonic() - started
        started = time.monotonic()
        await stream(client, "/v1/chat/completions", messages=user("a b c"))
        streamed = time.monotonic() - started
    assert whole >= 0.1
    assert streamed >= 4 * 0.1  # four tokens: "echo:", " a", " b", " c"


async def test_every_request_is_recorded_with_its_path_and_body_as_sent() -> None:
    body = {
        "messages": user("hi"),
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 42,
        "stop": ["\nuser:"],
        "max_tokens": 5,
    }
    async with running() as (backend, client):
        await client.get("/v1/models")
        await client.post("/v1/chat/completions", json=body)
        backend.config.fail = True
        await client.post("/v1/completions", json={"prompt": "p"})
    assert backend.requests == [
        {"path": "/v1/models", "body": None},
        {"path": "/v1/chat/completions", "body": body},
        {"path": "/v1/completions", "body": {"prompt": "p"}},
    ]


async def test_two_backends_answer_the_same_requests_identically() -> None:
    requests = [
        ("/v1/chat/completions", {"messages": user("call get_time"), "tools": [CLOCK]}),
        ("/v1/chat/completions", {"messages": user("hello"), "max_tokens": 1}),
        ("/v1/completions", {"prompt": "abc"}),
        ("/tokenize", {"content": "déjà vu"}),
        ("/apply-template", {"messages": user("hello")}),
    ]
    answers = []
    for _ in range(2):
        async with running(reasoning="hm") as (_, client):
            answers.append([(await client.post(p, json=b)).json() for p, b in requests])
    assert answers[0] == answers[1]


async def test_an_invalid_request_is_refused_with_an_openai_error() -> None:
    async with running() as (_, client):
        no_messages = await client.post("/v1/chat/completions", json={"messages": []})
        bad_max = await client.post(
            "/v1/chat/completions", json={"messages": user("a"), "max_tokens": -1}
        )
        not_json = await client.post("/v1/completions", content=b"{nope")
    for r in (no_messages, bad_max, not_json):
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"


async def test_an_exception_in_the_block_propagates_as_itself() -> None:
    with pytest.raises(KeyError):
        async with open_fake_backend():
            raise KeyError("mine")


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_the_backend_runs_under_a_cli_style_anyio_run(loop: str) -> None:
    async def main() -> str:
        async with (
            open_fake_backend(FakeBackendConfig(model="cli-model")) as backend,
            httpx.AsyncClient(base_url=backend.url) as client,
        ):
            return str((await client.get("/v1/models")).json()["data"][0]["id"])

    assert anyio.run(main, backend=loop) == "cli-model"


# The SDK stops reading its own generator chain at [DONE] without closing
# it; trio's finalizer reports that as a ResourceWarning. Not the fake's.
# (HTTP11ConnectionByteStream is httpcore2's, under the SDK from 3.63.)
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(AsyncStream._iter_events|SSEDecoder.aiter_bytes|Response.aiter_bytes"
    "|PoolByteStream.__aiter__|HTTP11ConnectionByteStream.__aiter__) "
    ":pytest.PytestUnraisableExceptionWarning"
)
async def test_the_openai_sdk_reads_whole_and_streamed_replies() -> None:
    import openai

    async with open_fake_backend() as backend:
        client = openai.AsyncOpenAI(base_url=f"{backend.url}/v1", api_key="none", max_retries=0)
        async with client:
            whole = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi there"}]
            )
            replies = await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "hi there"}],
                stream=True,
            )
            async with replies:
                pieces = [c.choices[0].delta.content or "" async for c in replies if c.choices]
    assert whole.choices[0].message.content == "echo: hi there"
    assert "".join(pieces) == "echo: hi there"
