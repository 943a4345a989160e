"""Chat admission over real HTTP: what /api/v2/generate/chat/async refuses,
lowers or truncates before anything is queued, operation keys, and the
limits chat requests share with text requests."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hordelite.contract.models import DEFAULT_REFERENCE
from hordelite.testing import ManualClock
from tests.integration._chat_helpers import (
    MODEL,
    STRICT,
    chat_body,
    open_chat_horde,
    pop_job,
    pop_nothing,
)
from tests.integration._helpers import assert_refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

# A model the shipped model reference lists: known without any worker.
REFERENCE_MODEL = next(iter(json.loads(DEFAULT_REFERENCE.read_text(encoding="utf-8"))))
# The horde's default window in which a worker counts as online after a pop.
WORKER_ONLINE_SECONDS = 300
REPLY = {"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}


# Models ----------------------------------------------------------------------------


async def test_an_unknown_model_is_refused_with_503_no_eligible_worker_and_nothing_is_queued() -> (
    None
):
    # The chat guide, "Worker availability": a model no online chat worker serves is
    # 503 no_eligible_worker, known to the horde or not.
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        response = await env.submit(chat_body(model="ghost-model"))
        refusal = assert_refused(response, 503, "no_eligible_worker")
        assert "ghost-model" in refusal["message"]
        assert refusal["param"] == "model"
        ghost = await env.chat_worker("ghost", model_id="ghost-model", online=False)
        await pop_nothing(ghost)


async def test_a_refusal_for_an_unserved_model_suggests_the_close_names_served_now() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        typo = MODEL[:-1] + ("x" if MODEL[-1] != "x" else "y")
        refusal = assert_refused(await env.submit(chat_body(model=typo)), 503, "no_eligible_worker")
        assert f"Served now: {MODEL!r}." in refusal["message"]
        far = assert_refused(await env.submit(chat_body(model="zzzz")), 503, "no_eligible_worker")
        assert "Served now" not in far["message"]


async def test_a_model_list_with_one_unserved_entry_is_served_by_the_others() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        body = chat_body(model=None, models=[MODEL, "ghost-model"])
        response = await env.submit(body)
        assert response.status_code == 202, response.text
        job = await pop_job(worker)
        assert job["model"] == MODEL


async def test_a_model_once_declared_whose_chat_workers_went_offline_is_refused_with_503() -> None:
    clock = ManualClock()
    async with open_chat_horde(clock=clock) as env:
        worker = await env.chat_worker("w")
        clock.advance(WORKER_ONLINE_SECONDS + 1)
        response = await env.submit(chat_body())
        assert_refused(response, 503, "no_eligible_worker")
        await pop_nothing(worker)


async def test_a_reference_model_without_any_worker_is_refused_with_503_and_nothing_is_queued() -> (
    None
):
    async with open_chat_horde() as env:
        response = await env.submit(chat_body(model=REFERENCE_MODEL))
        assert_refused(response, 503, "no_eligible_worker")
        worker = await env.chat_worker("w", model_id=REFERENCE_MODEL, online=False)
        await pop_nothing(worker)


async def test_a_model_served_only_by_text_workers_is_refused_with_503_no_eligible_worker() -> None:
    async with open_chat_horde() as env:
        text_worker = await env.text_worker("plain", models=[REFERENCE_MODEL])
        await pop_nothing(text_worker)
        response = await env.submit(chat_body(model=REFERENCE_MODEL))
        assert_refused(response, 503, "no_eligible_worker")


# Limits ----------------------------------------------------------------------------


async def test_max_tokens_above_every_serving_workers_max_length_is_lowered_to_the_largest() -> (
    None
):
    async with open_chat_horde() as env:
        await env.chat_worker("short", limits={"max_context_length": 8192, "max_length": 256})
        longer = await env.chat_worker(
            "longer", limits={"max_context_length": 8192, "max_length": 384}
        )
        response = await env.submit(chat_body(max_tokens=1000))
        assert response.status_code == 202, response.text
        answer = response.json()
        [adjustment] = answer["context_adjustments"]
        assert adjustment["field"] == "max_tokens"
        assert adjustment["requested"] == 1000
        assert adjustment["applied"] == 384
        assert isinstance(adjustment["reason"], str)
        assert (await env.status(answer["id"]))["context_adjustments"] == [adjustment]
        job = await pop_job(longer)
        assert job["payload"]["max_length"] == 384


async def test_a_request_without_max_tokens_gets_the_largest_max_length_of_the_serving_workers() -> (
    None
):
    async with open_chat_horde() as env:
        await env.chat_worker("short", limits={"max_context_length": 8192, "max_length": 256})
        longer = await env.chat_worker(
            "longer", limits={"max_context_length": 8192, "max_length": 384}
        )
        await env.queue(chat_body(max_tokens=None))
        assert (await pop_job(longer))["payload"]["max_length"] == 384


async def test_a_conversation_over_every_serving_workers_context_is_refused_with_400() -> None:
    async with open_chat_horde() as env:
        narrow = await env.chat_worker(
            "narrow", limits={"max_context_length": 512, "max_length": 64}
        )
        wide = await env.chat_worker("wide", limits={"max_context_length": 1024, "max_length": 64})
        # 3,000 characters are about 1,000 tokens at the horde's 3 a token.
        response = await env.submit(chat_body("x" * 3000, max_tokens=64))
        assert_refused(response, 400, "no_worker_supports_limit")
        await pop_nothing(narrow)
        await pop_nothing(wide)


async def test_truncate_oldest_drops_the_oldest_whole_turns_and_keeps_system_messages_and_the_latest_user_turn() -> (
    None
):
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", limits={"max_context_length": 1024, "max_length": 64})
        # The first turn alone is about 1,000 tokens (3 characters a token):
        # with max_tokens 64 the conversation is over 1,024 until it goes.
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "a" * 1500},
            {"role": "assistant", "content": "b" * 1500},
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": "How far is Paris from Lyon?"},
            {"role": "assistant", "content": "About 390 km."},
            {"role": "user", "content": "And by train?"},
        ]
        body = chat_body(messages=messages, max_tokens=64, horde={"context_fit": "truncate_oldest"})
        response = await env.submit(body)
        assert response.status_code == 202, response.text
        kept = [
            {"role": "system", "content": "You are terse."},
            {"role": "system", "content": "Use metric units."},
            {"role": "user", "content": "How far is Paris from Lyon?"},
            {"role": "assistant", "content": "About 390 km."},
            {"role": "user", "content": "And by train?"},
        ]
        [adjustment] = response.json()["context_adjustments"]
        assert adjustment["field"] == "messages"
        assert adjustment["requested"] == len(messages)
        assert adjustment["applied"] == len(kept)
        job = await pop_job(worker)
        assert job["payload"]["messages"] == kept


async def test_a_quote_over_max_kudos_is_refused_before_anything_is_queued() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        before = await env.kudos()
        response = await env.submit(chat_body(max_tokens=100, horde={"max_kudos": 0.01}))
        refusal = assert_refused(response, 400, "MaxKudosExceeded")
        assert "max_kudos" in refusal["message"]
        assert await env.kudos() == before
        await pop_nothing(worker)


async def test_a_quote_within_max_kudos_is_queued() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        await env.queue(chat_body(max_tokens=100, horde={"max_kudos": 1000}))
        await pop_job(worker)


# Operation keys ------------------------------------------------------------------------


async def test_a_resubmit_with_the_same_idempotency_key_returns_the_first_request_and_charges_nothing_again() -> (
    None
):
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        key = {"Idempotency-Key": "op-1"}
        before = await env.kudos()
        first = await env.queue(chat_body(), headers=key)
        assert await env.queue(chat_body(), headers=key) == first
        job = await pop_job(worker)
        await pop_nothing(worker)
        assert (await worker.submit_reply(job, REPLY)).status_code == 200
        charged = (await env.status(first))["kudos"]
        assert charged > 0
        assert await env.kudos() == pytest.approx(before - charged)
        assert await env.queue(chat_body(), headers=key) == first
        await pop_nothing(worker)
        assert await env.kudos() == pytest.approx(before - charged)


async def test_reordering_models_keeps_the_same_request_under_one_idempotency_key() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w", models=[MODEL, "other-model"])
        await env.chat_worker("other", model_id="other-model")
        key = {"Idempotency-Key": "op-1"}
        first = chat_body(model=None, models=[MODEL, "other-model"])
        reordered = chat_body(model=None, models=["other-model", MODEL])
        request_id = await env.queue(first, headers=key)
        assert await env.queue(reordered, headers=key) == request_id


async def test_a_different_body_under_a_used_idempotency_key_is_refused_with_409() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        key = {"Idempotency-Key": "op-1"}
        await env.queue(chat_body("Name one colour."), headers=key)
        response = await env.submit(chat_body("Name one animal."), headers=key)
        assert_refused(response, 409, "OperationKeyReused")
        job = await pop_job(worker)
        assert job["payload"]["messages"][0]["content"] == "Name one colour."
        await pop_nothing(worker)


async def test_anonymous_chat_submits_under_one_idempotency_key_are_separate_requests() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        key = {"Idempotency-Key": "op-1"}
        colour = await env.queue(chat_body("Name one colour."), key="0000000000", headers=key)
        animal = await env.queue(chat_body("Name one animal."), key="0000000000", headers=key)
        again = await env.queue(chat_body("Name one animal."), key="0000000000", headers=key)
        assert len({colour, animal, again}) == 3
        first = await env.queue(chat_body("Name one colour."), headers=key)
        assert await env.queue(chat_body("Name one colour."), headers=key) == first
        assert first != colour


# Limits shared with text requests --------------------------------------------------


@pytest.mark.parametrize("first_kind", ["chat", "text"])
async def test_a_chat_request_over_the_per_user_concurrency_is_refused_with_429(
    first_kind: str,
) -> None:
    async with open_chat_horde(concurrency=1) as env:
        await env.chat_worker("w")
        if first_kind == "chat":
            await env.queue(chat_body())
        else:
            await env.submit_text("Once upon", max_length=40)
        response = await env.submit(chat_body())
        assert_refused(response, 429, "TooManyPrompts")


async def test_a_chat_request_over_512_max_tokens_needs_its_kudos_up_front() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w", limits={"max_context_length": 8192, "max_length": 1024})
        poor = await env.horde.create_key("carol", kudos=0)
        response = await env.submit(chat_body(max_tokens=600), key=poor)
        assert_refused(response, 403, "KudosUpfront")
        await env.queue(chat_body(max_tokens=512), key=poor)
        await env.queue(chat_body(max_tokens=600))


# Refused bodies ------------------------------------------------------------------------


def _mentions(message: str, key: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) is not None


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        pytest.param({"top_k": 40}, "top_k", id="top_k"),
        pytest.param({"horde": {"quantizations": ["q4_k_m"]}}, "horde.quantizations", id="quant"),
        pytest.param({"horde": {"pinned_model": MODEL}}, "horde.pinned_model", id="pinned_model"),
        pytest.param({"n": 2}, "n", id="n-2"),
    ],
)
async def test_an_unsupported_parameter_is_refused_naming_the_key(
    fields: dict[str, Any], key: str
) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        response = await env.submit(chat_body(**fields))
        refusal = assert_refused(response, 400, "UnsupportedChatParameter")
        assert _mentions(refusal["message"], key), refusal
        await pop_nothing(worker)


TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        pytest.param(
            {"tool_choice": "auto"},
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            id="tool_choice-without-tools",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                    {"role": "user", "content": "Thanks."},
                ]
            },
            "messages.[1].role",
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response messages: call_1",
            id="unanswered-tool-call",
        ),
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "person",
                        "strict": True,
                        "schema": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}},
                            "required": ["name"],
                        },
                    },
                }
            },
            "response_format",
            "Invalid schema for response_format 'person': In context=(), 'additionalProperties' "
            "is required to be supplied and to be false.",
            id="strict-schema-open-object",
        ),
    ],
)
async def test_a_shape_openai_refuses_is_refused_with_openais_message_and_param(
    fields: dict[str, Any], param: str, message: str
) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["tools", "json_schema", *STRICT])
        response = await env.submit(chat_body(**fields))
        assert response.status_code == 400, response.text
        refusal = response.json()
        assert refusal["message"] == message
        assert refusal["param"] == param
        await pop_nothing(worker)


async def test_a_resubmit_with_the_same_idempotency_key_returns_the_first_request_after_its_workers_left() -> (
    None
):
    clock = ManualClock()
    async with open_chat_horde(clock=clock) as env:
        await env.chat_worker("w")
        key = {"Idempotency-Key": "op-offline"}
        first = await env.queue(chat_body(), headers=key)
        clock.advance(WORKER_ONLINE_SECONDS + 1)
        # Without its key the same body is refused now: no worker is online.
        assert_refused(await env.submit(chat_body()), 503, "no_eligible_worker")
        assert await env.queue(chat_body(), headers=key) == first


async def test_a_chat_request_in_a_class_idle_for_over_a_minute_is_queued_and_popped() -> None:
    # A submit refreshes its queue class at most once a minute; the refresh
    # must keep working after that minute.
    clock = ManualClock()
    async with open_chat_horde(clock=clock) as env:
        worker = await env.chat_worker("w")
        await env.queue(chat_body("first"))
        await pop_job(worker)
        clock.advance(61)
        second = await env.queue(chat_body("second"))
        job = await pop_job(worker)
        assert job["payload"]["messages"][-1]["content"] == "second"
        assert (await env.status(second))["processing"] == 1
