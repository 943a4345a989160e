"""Fuzz the OpenAI front: a valid chat completion mutated field by field, whole
bodies, model ids in paths, and headers, over real HTTP on SQLite and PostgreSQL.

The valid body names a model no worker serves, so that a body which passes
every check is refused last, 503 no_eligible_worker, and no call waits for a
reply: nothing a case sends may be stored or charged.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import strategies as st

from tests.chat_shapes import calling, function_tool, tool_call
from tests.fuzz._harness import (
    CORE_FRAGMENTS,
    FRONT_MODEL,
    HORDE_CHAT_OPTIONS,
    Batch,
    Fuzzer,
    Mutation,
    chat_options,
    huge_body,
    whole_bodies,
)
from tests.fuzz.test_native import HEADER_VALUES, SEGMENTS, header_values, segments

# Huge and deeply nested values make reports long; hypothesis says so.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

EXAMPLES = 60
PER_EXAMPLE = 5
COMPLETIONS = "/v1/chat/completions"

WEATHER_TOOL: dict[str, Any] = function_tool(
    "get_weather", "The weather in a city.", strings=["city"]
)


def completion_body() -> dict[str, Any]:
    return {
        "model": FRONT_MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather in Paris?"},
            calling(tool_call("call_1", "get_weather", '{"city": "Paris"}')),
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": [{"type": "text", "text": "Thanks. And tomorrow?"}]},
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "max_tokens": 64,
        **chat_options(),
        "reasoning_effort": "low",
        "horde": dict(HORDE_CHAT_OPTIONS),
    }


def send_completion(
    fuzzer: Fuzzer, content: bytes, field: str | None, headers: dict[str, Any] | None = None
) -> None:
    answer = fuzzer.send(
        "POST",
        COMPLETIONS,
        content=content,
        headers=headers
        or {"Authorization": f"Bearer {fuzzer.carol}", "Content-Type": "application/json"},
        field=field,
        accepted=(),
    )
    if answer is not None and answer.rc == "no_eligible_worker":
        # The only refusal a body may get once every field is valid; the
        # model is the one no worker serves, as sent.
        assert field is None or answer.named == "model", answer


def test_the_valid_completion_body_is_refused_last_for_its_unserved_model(fuzzer: Fuzzer) -> None:
    response = fuzzer.client.post(
        COMPLETIONS,
        json=completion_body(),
        headers={"Authorization": f"Bearer {fuzzer.carol}"},
    )
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "no_eligible_worker"


def test_chat_completions_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    def case(batch: Batch, changes: list[Mutation]) -> None:
        for change in changes:
            content, field = change.apply(completion_body())
            send_completion(fuzzer, content, field)

    fuzzer.explore_fields(completion_body(), case, examples=EXAMPLES * 2, per_example=PER_EXAMPLE)


def test_chat_completions_refuses_bodies_that_are_not_its_object(fuzzer: Fuzzer) -> None:
    def case(batch: Batch, bodies: list[bytes]) -> None:
        for content in bodies:
            send_completion(fuzzer, content, None)

    fuzzer.explore(
        st.lists(whole_bodies(completion_body()), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE),
        case,
        examples=EXAMPLES,
        min_cases=EXAMPLES * PER_EXAMPLE,
        systematic=[CORE_FRAGMENTS],
    )


def test_chat_completions_refuses_a_body_over_the_cap_with_413(fuzzer: Fuzzer) -> None:
    def case(batch: Batch) -> None:
        answer = fuzzer.send(
            "POST",
            COMPLETIONS,
            content=huge_body(completion_body()),
            headers={"Content-Type": "application/json"},
            fresh_connection=True,
            accepted=(),
        )
        assert answer is not None
        assert (answer.status, answer.rc) == (413, "PayloadTooLarge"), answer

    fuzzer.check_batch(case)


MODEL_ROUTES = [("GET", "/v1/models/{}"), ("GET", "/v1/models?{}"), ("GET", "/v1/{}")]


def test_models_answer_any_model_id_with_json(fuzzer: Fuzzer) -> None:
    one = st.tuples(st.sampled_from(MODEL_ROUTES), segments)

    def case(batch: Batch, cases: list[tuple[tuple[str, str], str]]) -> None:
        for (method, template), segment in cases:
            fuzzer.send(method, template.format(segment))

    fuzzer.explore(
        st.lists(one, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE),
        case,
        examples=EXAMPLES // 2,
        min_cases=EXAMPLES // 2 * PER_EXAMPLE * 8 // 10,  # httpx cannot send a few
        systematic=[[(route, segment) for segment in SEGMENTS] for route in MODEL_ROUTES],
    )


AUTHORIZATIONS = [
    b"",
    b"Bearer",
    b"Bearer ",
    b"Bearer 0000000000",
    b"bearer \xff\xfe",
    b"Basic dXNlcjpwYXNz",
    b"Bearer " + b"k" * 300,
    b"Bearer \xed\xa0\x80",
    b"Bearer %00",
    b"Bearer  key  with  spaces",
]
FRONT_HEADERS = ["Authorization", "Content-Type", "Client-Agent", "Idempotency-Key", "Accept"]


def test_chat_completions_answers_odd_headers_with_json(fuzzer: Fuzzer) -> None:
    values = st.one_of(st.sampled_from(AUTHORIZATIONS), header_values)
    overrides = st.dictionaries(st.sampled_from(FRONT_HEADERS), values, min_size=1, max_size=3)

    def case(batch: Batch, cases: list[dict[str, bytes]]) -> None:
        for override in cases:
            headers: dict[str, Any] = {
                "Authorization": f"Bearer {fuzzer.carol}",
                "Content-Type": "application/json",
                **override,
            }
            send_completion(fuzzer, json.dumps(completion_body()).encode(), None, headers)

    fuzzer.explore(
        st.lists(overrides, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE),
        case,
        examples=EXAMPLES,
        min_cases=EXAMPLES * PER_EXAMPLE * 8 // 10,
        systematic=[
            [{name: value} for value in AUTHORIZATIONS + HEADER_VALUES] for name in FRONT_HEADERS
        ],
    )
