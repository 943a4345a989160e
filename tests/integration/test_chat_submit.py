"""The structured chat submit over real HTTP: the reply, its verification,
its price and the chat status (worker guide: "6. Submit the reply", "Submit refusals";
the conformance decision's reply verification; chat guide: "Pricing by the text output estimate",
"Reasoning")."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.contract.generations import allowed_bytes
from hordelite.testing import FakeChatWorker, ManualClock
from tests.chat_shapes import function_tool, json_schema_format
from tests.integration._chat_helpers import ChatEnv, chat_price
from tests.integration._env import open_env_of
from tests.integration._helpers import assert_refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

# A model of known size, so that the price follows from the formula.
MODEL = "test/chat-13b"
BILLIONS = 13
JOB_TTL = 150  # the pop's ttl: the job's lease (worker guide, "Streaming progress")

WEATHER = function_tool("get_weather", "The weather at a place.", strings=["location"], closed=True)
TIME = function_tool("get_time", strings=["zone"], closed=True)
COLOUR_SCHEMA = json_schema_format("colour", ["colour"])


# Local helpers -------------------------------------------------------------


def expected_price(chars: int, max_length: int) -> tuple[float, float]:
    return chat_price(chars, max_length, BILLIONS)


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def weather_and_time_calls() -> list[dict[str, Any]]:
    """Two calls, one to each of the WEATHER and TIME tools."""
    return [
        call("call_1", "get_weather", {"location": "Paris"}),
        call("call_2", "get_time", {"zone": "Europe/Paris"}),
    ]


def tool_reply(*calls: dict[str, Any], finish_reason: str = "tool_calls") -> dict[str, Any]:
    return {
        "message": {"role": "assistant", "content": None, "tool_calls": list(calls)},
        "finish_reason": finish_reason,
    }


def text_reply(content: str, finish_reason: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "message": {"role": "assistant", "content": content},
        "finish_reason": finish_reason,
        **extra,
    }


def chat_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name one colour."},
        ],
        "max_tokens": 300,
    }
    body.update(fields)
    return body


class Chat(ChatEnv):
    """The set-up with one online chat worker of MODEL declaring every
    feature and guarantee."""

    model: ClassVar[str] = MODEL
    worker: FakeChatWorker

    async def pop(self) -> dict[str, Any]:
        job = await self.worker.pop()
        assert job["id"] is not None, job
        assert job.get("chat") is True, job
        return job

    async def balances(self) -> tuple[float, float]:
        return await self.kudos(self.requester), await self.kudos(self.owner)


@contextlib.asynccontextmanager
async def chat_horde(tmp_path: Path, clock: ManualClock | None = None) -> AsyncIterator[Chat]:
    """A horde with one online chat worker declaring every feature and
    guarantee for MODEL, a requester with kudos and the worker's owner."""
    reference = tmp_path / "models.json"
    reference.write_text(json.dumps({MODEL: {"parameters": BILLIONS * 10**9}}))
    async with open_env_of(
        Chat, requester_kudos=1000, clock=clock, model_reference=str(reference)
    ) as chat:
        chat.worker = await chat.enter(
            FakeChatWorker(
                chat.horde.url, chat.owner, name="w1", model_id=MODEL, chat_features=ALL_NAMES
            )
        )
        # The first pop declares the worker: the model then has a chat worker.
        assert (await chat.worker.pop())["id"] is None
        yield chat


@pytest.fixture
async def chat(tmp_path: Path) -> AsyncIterator[Chat]:
    """``chat_horde`` on the horde's own clock."""
    async with chat_horde(tmp_path) as opened:
        yield opened


async def assert_not_settled(chat: Chat, request_id: str, before: tuple[float, float]) -> None:
    status = await chat.status(request_id)
    assert status["done"] is False
    assert status["generations"] == []
    assert await chat.balances() == before


async def assert_settled(
    chat: Chat, before: tuple[float, float], charge: float, reward: float
) -> None:
    """Since the balances ``before``, the requester paid ``charge`` and the
    worker's owner earned ``reward``."""
    requester_after, owner_after = await chat.balances()
    assert requester_after == pytest.approx(before[0] - charge)
    assert owner_after == pytest.approx(before[1] + reward)


async def assert_reply_refused(
    chat: Chat, reply: dict[str, Any], rc: str, *, case: str, **fields: Any
) -> None:
    """The job of a request of ``chat_body(**fields)`` submits ``reply``:
    refused 400 ``rc`` (``case`` names it in a failure), the request is
    left unsettled."""
    request_id = await chat.queue(chat_body(**fields))
    job = await chat.pop()
    before = await chat.balances()
    r = await chat.worker.submit_reply(job, reply)
    assert_refused(r, 400, rc, case=case)
    await assert_not_settled(chat, request_id, before)


# The reply and its signals --------------------------------------------------


async def test_a_chat_request_completes_with_its_structured_reply_and_signals(chat: Chat) -> None:
    before = await chat.balances()
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    assert job["model"] == MODEL
    assert job["payload"]["messages"][-1] == {"role": "user", "content": "Name one colour."}
    assert "prompt" not in job["payload"]
    reasoning = "The user wants one colour. Blue is the most common answer."
    reply = {
        "message": {"role": "assistant", "content": "Blue.", "reasoning_content": reasoning},
        "finish_reason": "stop",
        "native_finish_reason": "eos_token",
        "prompt_tokens": 21,
        "completion_tokens": 0,  # a reported zero is kept
        # reasoning_tokens left out: shown as null
    }
    r = await chat.worker.submit_reply(job, reply)
    assert r.status_code == 200, r.text
    reward, charge = expected_price(len("Blue.") + len(reasoning), 300)
    assert r.json() == {"reward": reward}

    status = await chat.status(request_id)
    assert status["done"] is True
    assert status["faulted"] is False
    assert status["finished"] == 1
    assert status["kudos"] == charge
    [gen] = status["generations"]
    assert gen["message"] == {
        "role": "assistant",
        "content": "Blue.",
        "reasoning_content": reasoning,
    }
    assert gen["finish_reason"] == "stop"
    assert gen["native_finish_reason"] == "eos_token"
    assert gen["prompt_tokens"] == 21
    assert gen["completion_tokens"] == 0
    assert gen["reasoning_tokens"] is None
    assert gen["charge_basis"] == "output_estimate"
    assert gen["kudos"] == charge
    assert gen["model"] == MODEL
    assert gen["worker_name"] == "w1"
    await assert_settled(chat, before, charge, reward)


async def test_a_tool_call_reply_is_popped_submitted_shown_and_charged_by_its_arguments(
    chat: Chat,
) -> None:
    before = await chat.balances()
    request_id = await chat.queue(
        chat_body(
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],
            tool_choice="auto",
        )
    )
    job = await chat.pop()
    assert job["payload"]["tools"] == [WEATHER]
    # Long arguments: the charge is well above the 20-token floor.
    the_call = call("call_1", "get_weather", {"location": "Paris, " + "Île-de-France " * 20})
    r = await chat.worker.submit_reply(job, tool_reply(the_call))
    assert r.status_code == 200, r.text
    chars = len("get_weather") + len(the_call["function"]["arguments"])
    reward, charge = expected_price(chars, 300)
    assert reward > expected_price(0, 300)[0]  # not the floor
    assert r.json() == {"reward": reward}

    status = await chat.status(request_id)
    assert status["done"] is True
    [gen] = status["generations"]
    assert gen["message"] == {"role": "assistant", "content": None, "tool_calls": [the_call]}
    assert gen["finish_reason"] == "tool_calls"
    assert gen["charge_basis"] == "output_estimate"
    assert gen["kudos"] == charge
    await assert_settled(chat, before, charge, reward)


async def test_reasoning_is_priced_with_the_content(chat: Chat) -> None:
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    reasoning = "Let me think about colours. " * 10
    reply = {
        "message": {"role": "assistant", "content": "Green.", "reasoning_content": reasoning},
        "finish_reason": "stop",
    }
    r = await chat.worker.submit_reply(job, reply)
    assert r.status_code == 200, r.text
    reward, charge = expected_price(len("Green.") + len(reasoning), 300)
    assert reward > expected_price(len("Green."), 300)[0]  # the reasoning counts
    assert r.json() == {"reward": reward}
    assert (await chat.status(request_id))["kudos"] == charge


async def test_a_reply_whose_budget_went_to_reasoning_is_charged_for_its_max_length(
    chat: Chat,
) -> None:
    request_id = await chat.queue(chat_body(max_tokens=100))
    job = await chat.pop()
    reasoning = "Hmm, " * 200  # 1000 characters: 250 tokens by the estimate
    reply = {
        "message": {"role": "assistant", "content": "", "reasoning_content": reasoning},
        "finish_reason": "length",
    }
    r = await chat.worker.submit_reply(job, reply)
    assert r.status_code == 200, r.text
    reward, charge = expected_price(len(reasoning), 100)
    assert reward == round(100 * BILLIONS / 21, 2)  # capped at max_length
    assert r.json() == {"reward": reward}
    status = await chat.status(request_id)
    assert status["kudos"] == charge
    assert status["generations"][0]["message"]["content"] == ""
    assert status["generations"][0]["finish_reason"] == "length"


async def test_reported_token_counts_never_change_the_charge(chat: Chat) -> None:
    content = "Blue is a primary colour of light and of pigment alike."
    reward, charge = expected_price(len(content), 300)
    counts: tuple[dict[str, int], ...] = (
        {},
        {"prompt_tokens": 10_000_000, "completion_tokens": 10_000_000, "reasoning_tokens": 0},
        {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 10_000_000},
    )
    for reported in counts:
        before = await chat.balances()
        request_id = await chat.queue(chat_body())
        job = await chat.pop()
        r = await chat.worker.submit_reply(job, {**text_reply(content), **reported})
        assert r.status_code == 200, r.text
        assert r.json() == {"reward": reward}, reported
        status = await chat.status(request_id)
        assert status["kudos"] == charge, reported
        gen = status["generations"][0]
        for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
            assert gen[key] == reported.get(key), key
        await assert_settled(chat, before, charge, reward)


# Refusals ------------------------------------------------------------------


async def test_a_submit_naming_another_model_than_the_assigned_one_is_refused(chat: Chat) -> None:
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    before = await chat.balances()
    r = await chat.worker.submit_reply(job, {**text_reply("Blue."), "model_id": "other-model"})
    assert_refused(r, 400, "ChatModelMismatch")
    await assert_not_settled(chat, request_id, before)


_BIG_REASONING = "x" * (1024 * 1024 + 1)

INVALID_REPLIES: dict[str, dict[str, Any]] = {
    "no_message": {"finish_reason": "stop"},
    "message_not_an_object": {"message": "Blue.", "finish_reason": "stop"},
    "message_not_from_the_assistant": {
        "message": {"role": "user", "content": "Blue."},
        "finish_reason": "stop",
    },
    "null_content_without_calls": {
        "message": {"role": "assistant", "content": None},
        "finish_reason": "stop",
    },
    "no_finish_reason": {"message": {"role": "assistant", "content": "Blue."}},
    "unknown_finish_reason": text_reply("Blue.", finish_reason="eos_token"),
    "both_generation_and_message": {**text_reply("Blue."), "generation": "Blue."},
    "tool_calls_reason_without_calls": text_reply("Blue.", finish_reason="tool_calls"),
    "native_finish_reason_over_32_characters": text_reply("Blue.", native_finish_reason="n" * 33),
    "reasoning_content_over_1_MiB": {
        "message": {"role": "assistant", "content": "Blue.", "reasoning_content": _BIG_REASONING},
        "finish_reason": "stop",
    },
    "multibyte_reasoning_content_over_1_MiB": {
        # 524,289 characters, 1,048,578 bytes of UTF-8: the bound is in bytes.
        "message": {
            "role": "assistant",
            "content": "Blue.",
            "reasoning_content": "é" * (512 * 1024 + 1),
        },
        "finish_reason": "stop",
    },
    "negative_prompt_tokens": text_reply("Blue.", prompt_tokens=-1),
    "completion_tokens_over_ten_million": text_reply("Blue.", completion_tokens=10_000_001),
    "reasoning_tokens_over_ten_million": text_reply("Blue.", reasoning_tokens=10_000_001),
}


async def test_a_chat_submit_without_a_valid_structured_reply_is_refused(chat: Chat) -> None:
    for case, reply in INVALID_REPLIES.items():
        await assert_reply_refused(chat, reply, "ChatSubmitInvalid", case=case)


async def test_reply_bounds_accept_their_limits(chat: Chat) -> None:
    """The edges of the refusals above are accepted: 32 characters of
    native_finish_reason, reasoning up to the job's bound (decision 0069:
    content and reasoning together; 1 MiB is past the bound of the largest
    max_length), counts of 0 and 10,000,000."""
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    bound = allowed_bytes("chat", job["payload"]["max_length"])
    reply = {
        "message": {
            "role": "assistant",
            "content": "Blue.",
            "reasoning_content": "x" * (bound - len("Blue.")),
        },
        "finish_reason": "stop",
        "native_finish_reason": "n" * 32,
        "prompt_tokens": 0,
        "completion_tokens": 10_000_000,
    }
    r = await chat.worker.submit_reply(job, reply)
    assert r.status_code == 200, r.text
    gen = (await chat.status(request_id))["generations"][0]
    assert gen["native_finish_reason"] == "n" * 32
    assert (gen["prompt_tokens"], gen["completion_tokens"]) == (0, 10_000_000)


async def test_a_reply_past_its_jobs_bound_is_refused_and_one_at_it_is_taken(
    chat: Chat,
) -> None:
    # Content, reasoning and calls together, in bytes of UTF-8 (decision 0069).
    bound = allowed_bytes("chat", 64)
    request_id = await chat.queue(chat_body(max_tokens=64))
    job = await chat.pop()
    before = await chat.balances()
    over = text_reply("é" * 2000, reasoning_content="b" * (bound - 4000 + 1))
    over["message"]["reasoning_content"] = over.pop("reasoning_content")
    r = await chat.worker.submit_reply(job, over)
    assert_refused(r, 400, "ChatSubmitInvalid", case="over the bound")
    assert f"{bound} bytes" in r.json()["message"]
    await assert_not_settled(chat, request_id, before)
    at = text_reply("é" * 2000)
    at["message"]["reasoning_content"] = "b" * (bound - 4000)
    r = await chat.worker.submit_reply(job, at)
    assert r.status_code == 200, r.text
    status = await chat.status(request_id)
    assert status["done"] is True


async def test_a_structured_reply_on_a_text_jobs_submit_is_refused(chat: Chat) -> None:
    r = await chat.client.post(
        "/api/v2/generate/text/async",
        headers={"apikey": chat.requester},
        json={"prompt": "Once upon", "params": {"max_length": 40}, "models": [MODEL]},
    )
    assert r.status_code == 202, r.text
    request_id = r.json()["id"]
    job = await chat.worker.pop()
    assert job["id"] is not None
    assert "chat" not in job
    r = await chat.worker.submit_reply(job, text_reply("a time"))
    assert_refused(r, 400, "ChatSubmitInvalid")
    status = (await chat.client.get(f"/api/v2/generate/text/status/{request_id}")).json()
    assert status["done"] is False


# Verification against the request -------------------------------------------

# Each case: the request's fields, and a reply its tool_choice or
# response_format rules out.
NONCONFORMANT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "a_call_under_tool_choice_none": (
        {"tools": [WEATHER], "tool_choice": "none"},
        tool_reply(call("call_1", "get_weather", {"location": "Paris"})),
    ),
    "no_call_under_tool_choice_required": (
        {"tools": [WEATHER], "tool_choice": "required"},
        text_reply("It is sunny in Paris."),
    ),
    "no_call_under_a_named_function": (
        {
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        text_reply("It is sunny in Paris."),
    ),
    "a_call_to_another_function_than_the_named_one": (
        {
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        tool_reply(call("call_1", "get_time", {"zone": "Europe/Paris"}), finish_reason="stop"),
    ),
    "content_that_is_not_json_under_json_object": (
        {"response_format": {"type": "json_object"}},
        text_reply("Blue."),
    ),
    "a_json_array_under_json_object": (
        {"response_format": {"type": "json_object"}},
        text_reply('["blue"]'),
    ),
    "content_not_matching_a_strict_json_schema": (
        {"response_format": COLOUR_SCHEMA},
        text_reply('{"colour": 7}'),
    ),
    "content_that_is_not_an_object_under_a_non_strict_json_schema": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "colour", "schema": {"type": "string"}},
            }
        },
        text_reply('"blue"'),
    ),
}


async def test_a_strict_request_refuses_a_reply_its_tool_choice_or_response_format_rules_out(
    chat: Chat,
) -> None:
    for case, (fields, reply) in NONCONFORMANT.items():
        await assert_reply_refused(chat, reply, "ChatSubmitNonconformant", case=case, **fields)


async def test_a_strict_request_accepts_a_reply_matching_its_json_schema(chat: Chat) -> None:
    request_id = await chat.queue(chat_body(response_format=COLOUR_SCHEMA))
    job = await chat.pop()
    r = await chat.worker.submit_reply(job, text_reply('{"colour": "blue"}'))
    assert r.status_code == 200, r.text
    status = await chat.status(request_id)
    assert status["generations"][0]["message"]["content"] == '{"colour": "blue"}'


async def test_a_reply_that_only_calls_tools_is_not_checked_against_the_response_format(
    chat: Chat,
) -> None:
    request_id = await chat.queue(chat_body(tools=[WEATHER], response_format=COLOUR_SCHEMA))
    job = await chat.pop()
    the_call = call("call_1", "get_weather", {"location": "Paris"})
    r = await chat.worker.submit_reply(job, tool_reply(the_call))
    assert r.status_code == 200, r.text
    [gen] = (await chat.status(request_id))["generations"]
    assert gen["message"] == {"role": "assistant", "content": None, "tool_calls": [the_call]}


async def test_a_best_effort_request_shows_that_reply_as_submitted(chat: Chat) -> None:
    for case, (fields, reply) in NONCONFORMANT.items():
        request_id = await chat.queue(chat_body(**fields, horde={"conformance": "best_effort"}))
        job = await chat.pop()
        r = await chat.worker.submit_reply(job, reply)
        assert r.status_code == 200, (case, r.text)
        status = await chat.status(request_id)
        assert status["done"] is True, case
        [gen] = status["generations"]
        assert gen["message"] == reply["message"], case
        assert gen["finish_reason"] == reply["finish_reason"], case


async def test_a_best_effort_request_shows_every_call_under_parallel_tool_calls_false(
    chat: Chat,
) -> None:
    request_id = await chat.queue(
        chat_body(
            tools=[WEATHER, TIME],
            parallel_tool_calls=False,
            horde={"conformance": "best_effort"},
        )
    )
    job = await chat.pop()
    calls = weather_and_time_calls()
    r = await chat.worker.submit_reply(job, tool_reply(*calls))
    assert r.status_code == 200, r.text
    [gen] = (await chat.status(request_id))["generations"]
    assert gen["message"]["tool_calls"] == calls


UNUSABLE: dict[str, dict[str, Any]] = {
    "a_call_to_a_function_not_in_the_tools": tool_reply(
        call("call_1", "get_weather", {"location": "Paris"}),
        call("call_2", "delete_everything", {}),
    ),
    "two_calls_with_one_id": tool_reply(
        call("call_1", "get_weather", {"location": "Paris"}),
        call("call_1", "get_time", {"zone": "Europe/Paris"}),
    ),
}


async def test_a_reply_no_client_could_use_is_refused_under_every_conformance_mode(
    chat: Chat,
) -> None:
    for conformance in ("strict", "best_effort"):
        for case, reply in UNUSABLE.items():
            await assert_reply_refused(
                chat,
                reply,
                "ChatSubmitInvalid",
                case=f"{case} under {conformance}",
                tools=[WEATHER, TIME],
                horde={"conformance": conformance},
            )


async def test_a_call_to_a_function_left_out_by_narrowing_is_still_usable(chat: Chat) -> None:
    """The check uses every tool the client offered: under a named function
    the worker receives one tool, and a best_effort reply calling another of
    the client's tools is delivered."""
    request_id = await chat.queue(
        chat_body(
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            horde={"conformance": "best_effort"},
        )
    )
    job = await chat.pop()
    assert [t["function"]["name"] for t in job["payload"]["tools"]] == ["get_weather"]
    the_call = call("call_1", "get_time", {"zone": "UTC"})
    r = await chat.worker.submit_reply(job, tool_reply(the_call, finish_reason="stop"))
    assert r.status_code == 200, r.text
    [gen] = (await chat.status(request_id))["generations"]
    assert gen["message"]["tool_calls"] == [the_call]


async def test_a_strict_single_call_request_shows_only_the_first_of_several_calls(
    chat: Chat,
) -> None:
    request_id = await chat.queue(chat_body(tools=[WEATHER, TIME], parallel_tool_calls=False))
    job = await chat.pop()
    assert job["payload"]["parallel_tool_calls"] is False
    calls = weather_and_time_calls()
    r = await chat.worker.submit_reply(job, tool_reply(*calls))
    assert r.status_code == 200, r.text
    [gen] = (await chat.status(request_id))["generations"]
    assert gen["message"]["tool_calls"] == calls[:1]
    assert gen["finish_reason"] == "tool_calls"


async def test_a_reply_to_a_named_function_is_shown_with_finish_reason_stop(chat: Chat) -> None:
    request_id = await chat.queue(
        chat_body(
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    job = await chat.pop()
    the_call = call("call_1", "get_weather", {"location": "Paris"})
    r = await chat.worker.submit_reply(job, tool_reply(the_call, finish_reason="tool_calls"))
    assert r.status_code == 200, r.text
    [gen] = (await chat.status(request_id))["generations"]
    assert gen["finish_reason"] == "stop"
    assert gen["message"]["tool_calls"] == [the_call]


# The job's end -------------------------------------------------------------


async def test_a_second_submit_for_the_same_job_is_refused_with_DuplicateGen(chat: Chat) -> None:
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    r = await chat.worker.submit_reply(job, text_reply("Blue."))
    assert r.status_code == 200, r.text
    settled = await chat.balances()
    r = await chat.worker.submit_reply(job, text_reply("Red."))
    assert_refused(r, 400, "DuplicateGen")
    status = await chat.status(request_id)
    assert [g["message"]["content"] for g in status["generations"]] == ["Blue."]
    assert await chat.balances() == settled


async def test_a_submit_after_the_jobs_lease_ran_out_is_refused_with_AbortedGen(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with chat_horde(tmp_path, clock=clock) as chat:
        request_id = await chat.queue(chat_body())
        job = await chat.pop()
        assert job["ttl"] == JOB_TTL
        before = await chat.balances()
        clock.advance(JOB_TTL + 1)
        r = await chat.worker.submit_reply(job, text_reply("Blue."))
        assert_refused(r, 400, "AbortedGen")
        await assert_not_settled(chat, request_id, before)


async def test_a_job_that_does_not_stream_is_submitted_as_usual_after_its_request_was_deleted(
    chat: Chat,
) -> None:
    # Worker guide, step 7: such a job is not settled at the cancel; it is submitted
    # as usual and rewarded for the reply.
    request_id = await chat.queue(chat_body())
    job = await chat.pop()
    r = await chat.client.delete(f"/api/v2/generate/chat/status/{request_id}")
    assert r.status_code == 200, r.text
    r = await chat.worker.submit_reply(job, text_reply("Blue."))
    assert r.status_code == 200, r.text
    assert r.json()["reward"] > 0
    status = await chat.status(request_id)
    assert [g["message"]["content"] for g in status["generations"]] == ["Blue."]
