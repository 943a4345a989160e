"""Chat routing end to end over real HTTP: the worker's declaration on pop
(worker guide, step 1), routing by features, guarantees and limits (the
conformance decision), the
chat job payload (worker guide, step 2), and the model and worker listings."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hordelite.testing import FakeChatWorker
from tests.chat_shapes import calling, tool_call
from tests.integration._chat_helpers import (
    MODEL,
    STRICT,
    TIME_TOOL,
    WEATHER_TOOL,
    ChatEnv,
    chat_body,
    chat_status_path,
    open_chat_horde,
    pop_job,
    pop_nothing,
    text_status_path,
)
from tests.integration._helpers import assert_refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    calling(tool_call("call_1", "get_weather", '{"city": "Paris"}')),
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    {"role": "user", "content": "Should I take an umbrella?"},
]
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
    "additionalProperties": False,
}


async def assert_routed(
    env: ChatEnv,
    body: dict[str, Any],
    refused: list[Any],
    accepted: Any,
) -> dict[str, Any]:
    """Queue ``body``: every worker in ``refused`` pops nothing, then
    ``accepted`` pops the job, which is returned."""
    await env.queue(body)
    for worker in refused:
        await pop_nothing(worker)
    return await pop_job(accepted)


# Declarations (worker guide, step 1) -------------------------------------------------


async def test_a_pop_with_a_valid_chat_declaration_returns_200() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["seed", *STRICT], online=False)
        response = await worker.client.post("/generate/text/pop", json=worker.pop_body())
        assert response.status_code == 200, response.text
        assert response.json()["id"] is None


def _without(key: str) -> Any:
    def change(body: dict[str, Any]) -> None:
        del body[key]

    return change


def _set(**values: Any) -> Any:
    def change(body: dict[str, Any]) -> None:
        body.update(values)

    return change


def _negative_tools_temperature(body: dict[str, Any]) -> None:
    body["chat_limits"] = {**body["chat_limits"], "tools_max_temperature": -0.5}


def _prompt_jobs_false_without_chat_jobs(body: dict[str, Any]) -> None:
    for key in ("chat_jobs", "chat_features", "chat_limits", "model_id", "image_transports"):
        del body[key]
    body["prompt_jobs"] = False


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(_without("chat_limits"), "chat_limits", id="chat_jobs-without-chat_limits"),
        pytest.param(_without("model_id"), "model_id", id="chat_jobs-without-model_id"),
        pytest.param(_set(model_id="other-model"), "model_id", id="model_id-outside-models"),
        pytest.param(
            _negative_tools_temperature,
            "tools_max_temperature",
            id="negative-tools_max_temperature",
        ),
        pytest.param(
            _prompt_jobs_false_without_chat_jobs,
            "prompt_jobs",
            id="prompt_jobs-false-without-chat_jobs",
        ),
    ],
)
async def test_an_invalid_chat_declaration_is_refused_on_pop(change: Any, field: str) -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", online=False)
        body = worker.pop_body()
        change(body)
        response = await worker.client.post("/generate/text/pop", json=body)
        refusal = assert_refused(response, 400, "ChatDeclarationInvalid")
        assert field in refusal["message"], refusal


async def test_unknown_chat_feature_and_transport_names_are_ignored() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker(
            "w",
            ["seed", "telepathy", *STRICT],
            image_transports=["url", "carrier_pigeon"],
        )
        chat = (await env.worker_details("w"))["chat"]
        assert chat["features"] == ["seed", *STRICT]
        assert chat["image_transports"] == ["url"]


async def test_worker_details_read_back_the_chat_declaration_of_the_last_pop() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker(
            "w",
            ["seed", "tools", *STRICT],
            limits={"max_context_length": 4096, "max_length": 512, "tools_max_temperature": 1.0},
            image_transports=["messages_url"],
            models=[MODEL, "other-model"],
        )
        details = await env.worker_details("w")
        assert details["accepts_chat_jobs"] is True
        assert details["accepts_prompt_jobs"] is True
        assert details["chat"] == {
            "model_id": MODEL,
            "features": ["seed", "tools", *STRICT],
            "limits": {"max_context_length": 4096, "max_length": 512, "tools_max_temperature": 1.0},
            "image_transports": ["messages_url"],
        }
        worker.model_id = "other-model"
        worker.chat_features = ["presence_penalty"]
        worker.chat_limits = {"max_context_length": 2048, "max_length": 256}
        worker.image_transports = []
        worker.prompt_jobs = False
        await pop_nothing(worker)
        details = await env.worker_details("w")
        assert details["accepts_chat_jobs"] is True
        assert details["accepts_prompt_jobs"] is False
        assert details["chat"] == {
            "model_id": "other-model",
            "features": ["presence_penalty"],
            "limits": {"max_context_length": 2048, "max_length": 256},
            "image_transports": [],
        }


async def test_a_pop_without_chat_jobs_withdraws_the_chat_declaration() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        request_id = await env.queue(chat_body())
        same_worker = await env.text_worker("w")
        await pop_nothing(same_worker)
        details = await env.worker_details("w")
        assert details["accepts_chat_jobs"] is False
        assert "chat" not in details
        status = await env.status(request_id)
        assert status["processing"] == 0
        assert status["waiting"] == 1


async def test_text_models_carry_the_chat_declarations_only_when_asked_for() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker(
            "small",
            ["seed", *STRICT],
            limits={"max_context_length": 2048, "max_length": 800},
        )
        await env.chat_worker(
            "large",
            ["tools", *STRICT],
            limits={"max_context_length": 8192, "max_length": 300},
        )
        text_only = await env.text_worker("plain", models=["text-model"])
        await pop_nothing(text_only)
        response = await env.client.get("/api/v2/status/models?type=text&chat=true")
        assert response.status_code == 200, response.text
        listed = {m["name"]: m for m in response.json()}
        assert listed[MODEL]["chat"] == {
            "workers": 2,
            "max_context_length": 8192,
            "max_length": 800,
            "features": sorted({"seed", "tools", *STRICT}),
        }
        assert "chat" not in listed["text-model"]
        response = await env.client.get("/api/v2/status/models?type=text")
        assert response.status_code == 200, response.text
        plain = {m["name"]: m for m in response.json()}
        assert set(plain) == {MODEL, "text-model"}
        assert all("chat" not in m for m in plain.values())


async def test_the_assigned_model_and_limits_survive_a_later_change_of_declaration() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker(
            "w",
            limits={"max_context_length": 4096, "max_length": 512},
            models=[MODEL, "other-model"],
        )
        request_id = await env.queue(chat_body())
        job = await pop_job(worker)
        assert job["model"] == MODEL
        assert job["payload"]["max_context_length"] == 4096
        worker.model_id = "other-model"
        worker.chat_limits = {"max_context_length": 2048, "max_length": 256}
        await pop_nothing(worker)
        assert (await env.worker_details("w"))["chat"]["model_id"] == "other-model"
        response = await worker.submit_reply(
            job, {"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}
        )
        assert response.status_code == 200, response.text
        status = await env.status(request_id)
        assert status["done"] is True
        assert status["generations"][0]["model"] == MODEL


# Routing by features and guarantees (the conformance decision) ---------------------


async def test_a_tools_request_waits_for_a_worker_declaring_tools_and_is_not_possible_without_one() -> (
    None
):
    async with open_chat_horde() as env:
        plain = await env.chat_worker("plain")
        request_id = await env.queue(chat_body(tools=[WEATHER_TOOL]))
        status = await env.status(request_id)
        assert status["is_possible"] is False
        assert status["impossible_reason"]["rc"] == "no_worker_supports_features"
        await pop_nothing(plain)
        with_tools = await env.chat_worker("tooled", ["tools", *STRICT], online=False)
        job = await pop_job(with_tools)
        assert job["payload"]["tools"] == [WEATHER_TOOL]


async def test_a_tool_history_alone_needs_a_worker_declaring_tools() -> None:
    async with open_chat_horde() as env:
        plain = await env.chat_worker("plain")
        with_tools = await env.chat_worker("tooled", ["tools", *STRICT], online=False)
        job = await assert_routed(
            env, chat_body(messages=copy.deepcopy(TOOL_HISTORY)), [plain], with_tools
        )
        assert "tools" not in job["payload"]
        assert job["payload"]["messages"][1]["tool_calls"] == TOOL_HISTORY[1]["tool_calls"]


async def test_a_json_schema_request_goes_only_to_a_worker_declaring_json_schema() -> None:
    async with open_chat_horde() as env:
        plain = await env.chat_worker("plain")
        json_object = await env.chat_worker("object", ["json_object", *STRICT], online=False)
        json_schema = await env.chat_worker("schema", ["json_schema", *STRICT], online=False)
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
        }
        job = await assert_routed(
            env, chat_body(response_format=response_format), [plain, json_object], json_schema
        )
        assert job["payload"]["response_format"] == response_format


async def test_a_strict_request_needs_a_worker_declaring_prompt_overflow_refused() -> None:
    async with open_chat_horde() as env:
        bare = await env.chat_worker("bare", [])
        refusing = await env.chat_worker("refusing", STRICT, online=False)
        await assert_routed(env, chat_body(), [bare], refusing)


async def test_a_best_effort_request_does_not_need_prompt_overflow_refused() -> None:
    async with open_chat_horde() as env:
        bare = await env.chat_worker("bare", [])
        await env.queue(chat_body(horde={"conformance": "best_effort"}))
        await pop_job(bare)


FORCED_CHOICES = [
    pytest.param("required", id="required"),
    pytest.param({"type": "function", "function": {"name": "get_weather"}}, id="named-function"),
]


@pytest.mark.parametrize("tool_choice", FORCED_CHOICES)
async def test_a_strict_request_forcing_a_tool_call_needs_tool_choice_enforced(
    tool_choice: Any,
) -> None:
    async with open_chat_horde() as env:
        unenforced = await env.chat_worker("unenforced", ["tools", *STRICT])
        enforced = await env.chat_worker(
            "enforced", ["tools", "tool_choice_enforced", *STRICT], online=False
        )
        body = chat_body(tools=[WEATHER_TOOL], tool_choice=tool_choice)
        await assert_routed(env, body, [unenforced], enforced)


async def test_a_strict_request_with_tool_choice_auto_does_not_need_tool_choice_enforced() -> None:
    async with open_chat_horde() as env:
        unenforced = await env.chat_worker("unenforced", ["tools", *STRICT])
        await env.queue(chat_body(tools=[WEATHER_TOOL], tool_choice="auto"))
        await pop_job(unenforced)


async def test_a_strict_json_schema_request_needs_structured_output_enforced() -> None:
    async with open_chat_horde() as env:
        unenforced = await env.chat_worker("unenforced", ["json_schema", *STRICT])
        enforced = await env.chat_worker(
            "enforced", ["json_schema", "structured_output_enforced", *STRICT], online=False
        )
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
        }
        await assert_routed(env, chat_body(response_format=response_format), [unenforced], enforced)


@pytest.mark.parametrize(
    ("fields", "capabilities"),
    [
        pytest.param(
            {"tools": [WEATHER_TOOL], "tool_choice": "required"},
            ["tools"],
            id="tool_choice-required",
        ),
        pytest.param(
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            ["tools"],
            id="named-function",
        ),
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
                }
            },
            ["json_schema"],
            id="strict-json_schema",
        ),
    ],
)
async def test_a_best_effort_request_needs_no_guarantee(
    fields: dict[str, Any], capabilities: list[str]
) -> None:
    async with open_chat_horde() as env:
        without_guarantees = await env.chat_worker("w", capabilities)
        await env.queue(chat_body(horde={"conformance": "best_effort"}, **fields))
        await pop_job(without_guarantees)


@pytest.mark.parametrize(
    ("fields", "capability"),
    [
        pytest.param({"seed": 42}, "seed", id="seed"),
        pytest.param({"presence_penalty": 0.5}, "presence_penalty", id="presence_penalty"),
        pytest.param({"frequency_penalty": -0.5}, "frequency_penalty", id="frequency_penalty"),
    ],
)
async def test_a_sampling_field_away_from_its_default_needs_a_worker_declaring_its_capability(
    fields: dict[str, Any], capability: str
) -> None:
    async with open_chat_horde() as env:
        lacking = await env.chat_worker("lacking")
        declaring = await env.chat_worker("declaring", [capability, *STRICT], online=False)
        await assert_routed(env, chat_body(**fields), [lacking], declaring)


async def test_any_reasoning_effort_none_included_needs_a_worker_declaring_reasoning_effort() -> (
    None
):
    async with open_chat_horde() as env:
        lacking = await env.chat_worker("lacking")
        declaring = await env.chat_worker("declaring", ["reasoning_effort", *STRICT], online=False)
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
            job = await assert_routed(env, chat_body(reasoning_effort=effort), [lacking], declaring)
            assert job["payload"]["reasoning_effort"] == effort


async def test_fields_at_their_default_need_no_capability() -> None:
    async with open_chat_horde() as env:
        plain = await env.chat_worker("plain")
        defaults: dict[str, Any] = {
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "response_format": {"type": "text"},
            "n": 1,
            "logprobs": False,
        }
        await env.queue(chat_body(**defaults))
        await pop_job(plain)


MODES = [pytest.param("strict", id="strict"), pytest.param("best_effort", id="best_effort")]


async def clamping_worker(env: ChatEnv) -> FakeChatWorker:
    """An online tools worker that takes tools requests up to temperature 1.0."""
    return await env.chat_worker(
        "clamping",
        ["tools", *STRICT],
        limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
    )


@pytest.mark.parametrize("conformance", MODES)
async def test_a_tools_request_above_a_workers_tools_max_temperature_is_not_given_to_it(
    conformance: str,
) -> None:
    async with open_chat_horde() as env:
        clamping = await clamping_worker(env)
        unclamped = await env.chat_worker("unclamped", ["tools", *STRICT], online=False)
        body = chat_body(tools=[WEATHER_TOOL], temperature=1.5, horde={"conformance": conformance})
        job = await assert_routed(env, body, [clamping], unclamped)
        assert job["payload"]["temperature"] == 1.5


@pytest.mark.parametrize("conformance", MODES)
async def test_a_tools_request_below_a_workers_tools_max_temperature_is_given_to_it(
    conformance: str,
) -> None:
    async with open_chat_horde() as env:
        clamping = await clamping_worker(env)
        body = chat_body(tools=[WEATHER_TOOL], temperature=0.5, horde={"conformance": conformance})
        await env.queue(body)
        job = await pop_job(clamping)
        assert job["payload"]["temperature"] == 0.5


async def test_a_tools_request_over_every_workers_tools_max_temperature_is_not_possible() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker(
            "clamping",
            ["tools", *STRICT],
            limits={"max_context_length": 8192, "max_length": 1024, "tools_max_temperature": 1.0},
        )
        request_id = await env.queue(chat_body(tools=[WEATHER_TOOL], temperature=1.5))
        status = await env.status(request_id)
        assert status["is_possible"] is False
        assert status["impossible_reason"]["rc"] == "no_worker_supports_features"


async def test_a_request_over_a_workers_chat_max_length_is_not_given_to_it() -> None:
    async with open_chat_horde() as env:
        short = await env.chat_worker(
            "short", limits={"max_context_length": 8192, "max_length": 256}, max_length=4096
        )
        long = await env.chat_worker(
            "long", limits={"max_context_length": 8192, "max_length": 1024}
        )
        job = await assert_routed(env, chat_body(max_tokens=512), [short], long)
        assert job["payload"]["max_length"] == 512


async def test_a_conversation_over_a_workers_chat_context_is_not_given_to_it() -> None:
    async with open_chat_horde() as env:
        narrow = await env.chat_worker(
            "narrow",
            limits={"max_context_length": 512, "max_length": 256},
            max_context_length=100_000,
        )
        wide = await env.chat_worker("wide", limits={"max_context_length": 8192, "max_length": 256})
        # About 600 tokens at the horde's 3 characters per token: over 512.
        await assert_routed(env, chat_body("tell me more " * 140, max_tokens=32), [narrow], wide)


async def test_a_worker_that_predates_chat_never_receives_a_chat_job() -> None:
    async with open_chat_horde() as env:
        chat_worker = await env.chat_worker("chat")
        legacy = await env.text_worker("legacy", models=[MODEL], max_length=4096)
        await env.queue(chat_body())
        await pop_nothing(legacy)
        await pop_job(chat_worker)


async def test_a_chat_worker_still_pops_text_jobs_with_an_unchanged_response() -> None:
    async with open_chat_horde() as env:
        plain = await env.text_worker("plain")
        await env.submit_text("Once upon", max_length=40)
        reference = await pop_job(plain)
        chat_worker = await env.chat_worker("chat")
        request_id = await env.submit_text("Once upon", max_length=40)
        job = await pop_job(chat_worker)
        assert "chat" not in job
        assert set(job) == set(reference)
        assert job["payload"] == reference["payload"]
        await chat_worker.submit(job["id"], "a time")
        status = (await env.client.get(text_status_path(request_id))).json()
        assert status["done"] is True
        assert status["generations"][0]["text"] == "a time"


async def test_a_chat_only_worker_does_not_pop_text_jobs() -> None:
    async with open_chat_horde() as env:
        chat_only = await env.chat_worker("chat-only", prompt_jobs=False)
        request_id = await env.submit_text("Once upon", max_length=40)
        await pop_nothing(chat_only)
        status = (await env.client.get(text_status_path(request_id))).json()
        assert status["is_possible"] is False


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_chat_id_is_not_found_on_the_text_status_route(method: str) -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        request_id = await env.queue(chat_body())
        response = await env.client.request(method, text_status_path(request_id))
        assert_refused(response, 404, "RequestNotFound")
        status = await env.status(request_id)
        assert status["done"] is False
        assert status["waiting"] == 1


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_text_id_is_not_found_on_the_chat_status_route(method: str) -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w")
        request_id = await env.submit_text("Once upon", max_length=40)
        response = await env.client.request(method, chat_status_path(request_id))
        assert_refused(response, 404, "RequestNotFound")
        status = (await env.client.get(text_status_path(request_id))).json()
        assert status["done"] is False
        assert status["waiting"] == 1


def _image_body(url: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return chat_body(messages=[{"role": "user", "content": content}])


@pytest.mark.parametrize("transport", ["url", "base64"])
async def test_an_image_needs_a_worker_declaring_vision_with_either_transport(
    transport: str,
) -> None:
    """The horde takes the image in at submit (stored as JPEG), so any
    vision worker can have it, by the transport it declared; a worker
    without vision never gets it."""
    async with open_chat_horde() as env:
        blind = await env.chat_worker("blind", image_transports=[transport])
        seeing = await env.chat_worker(
            "seeing", ["vision", *STRICT], image_transports=[transport], online=False
        )
        url = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
        job = await assert_routed(env, _image_body(url), [blind], seeing)
        handed = job["payload"]["messages"][0]["content"][1]["image_url"]["url"]
        if transport == "url":
            assert handed.startswith(env.horde.url + "/blobs/"), handed
        else:
            assert handed.startswith("data:image/jpeg;base64,"), handed[:40]


async def test_an_image_url_the_horde_may_not_fetch_is_refused_naming_the_part() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("seeing", ["vision", *STRICT], image_transports=["url"])
        response = await env.submit(_image_body("http://10.0.0.1/cat.jpg"))
        assert_refused(response, 400, "ChatRequestInvalid")
        assert "messages[0].content[1].image_url" in response.json()["message"]


# The chat job payload (worker guide, step 2) ---------------------------------------


async def test_a_chat_job_is_marked_chat_and_carries_messages_without_a_prompt() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        await env.queue(chat_body("Name one colour."))
        job = await pop_job(worker)
        assert job["chat"] is True
        assert job["payload"]["messages"] == [{"role": "user", "content": "Name one colour."}]
        assert "prompt" not in job["payload"]


async def test_a_developer_message_reaches_the_worker_as_a_system_message() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        messages = [
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": "Name one colour."},
        ]
        await env.queue(chat_body(messages=messages))
        job = await pop_job(worker)
        assert job["payload"]["messages"] == [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Name one colour."},
        ]


# OpenAI's defaults (temperature 1, top_p 1, no penalties) and neutral
# backend samplers (the worker guide's step 2 example payload).
OPENAI_DEFAULTS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "rep_pen": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


async def test_every_sampling_field_reaches_the_worker_with_openais_default_when_omitted() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        await env.queue(chat_body())
        payload = (await pop_job(worker))["payload"]
        assert {k: payload[k] for k in OPENAI_DEFAULTS} == OPENAI_DEFAULTS


async def test_sampling_fields_the_client_sends_reach_the_worker_as_sent() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["presence_penalty", "frequency_penalty", *STRICT])
        sent: dict[str, Any] = {
            "temperature": 0.3,
            "top_p": 0.9,
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
        }
        await env.queue(chat_body(**sent))
        payload = (await pop_job(worker))["payload"]
        assert {k: payload[k] for k in sent} == sent
        neutral = {k: OPENAI_DEFAULTS[k] for k in ("rep_pen", "top_k", "min_p")}
        assert {k: payload[k] for k in neutral} == neutral


async def test_stop_sequence_and_seed_are_absent_when_the_client_did_not_send_them() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["seed", *STRICT])
        await env.queue(chat_body())
        payload = (await pop_job(worker))["payload"]
        assert "stop_sequence" not in payload
        assert "seed" not in payload


async def test_stop_sequence_and_seed_reach_the_worker_when_sent() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["seed", *STRICT])
        await env.queue(chat_body(stop=["\nuser:", "END"], seed=42))
        payload = (await pop_job(worker))["payload"]
        assert payload["stop_sequence"] == ["\nuser:", "END"]
        assert payload["seed"] == 42


async def test_a_worker_declaring_reasoning_effort_receives_medium_when_the_client_omits_it() -> (
    None
):
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["reasoning_effort", *STRICT])
        await env.queue(chat_body())
        assert (await pop_job(worker))["payload"]["reasoning_effort"] == "medium"


async def test_a_worker_not_declaring_reasoning_effort_does_not_receive_the_key() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w")
        await env.queue(chat_body())
        assert "reasoning_effort" not in (await pop_job(worker))["payload"]


async def test_a_tool_choice_none_request_does_not_need_tools() -> None:
    async with open_chat_horde() as env:
        plain = await env.chat_worker("plain")
        await env.queue(chat_body(tools=[WEATHER_TOOL], tool_choice="none"))
        await pop_job(plain)


async def test_a_tool_choice_none_request_reaches_the_worker_without_any_tool_key() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["tools", *STRICT])
        body = chat_body(
            tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="none", parallel_tool_calls=False
        )
        await env.queue(body)
        payload = (await pop_job(worker))["payload"]
        assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(payload)


async def test_a_named_function_reaches_the_worker_alone_under_required() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["tools", "tool_choice_enforced", *STRICT])
        body = chat_body(
            tools=[WEATHER_TOOL, TIME_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
        await env.queue(body)
        payload = (await pop_job(worker))["payload"]
        assert payload["tools"] == [TIME_TOOL]
        assert payload["tool_choice"] == "required"


async def test_unknown_keys_inside_messages_parts_tools_and_tool_choice_are_not_forwarded() -> None:
    async with open_chat_horde() as env:
        worker = await env.chat_worker("w", ["tools", "tool_choice_enforced", *STRICT])
        messages = [
            {"role": "system", "content": "Be brief.", "x_note": "internal"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather in Oslo?", "cache_control": {}}],
                "x_trace": 7,
            },
        ]
        weather = copy.deepcopy(WEATHER_TOOL)
        weather["x_origin"] = "catalogue"
        weather["function"]["x_version"] = 2
        body = chat_body(
            messages=messages,
            tools=[weather],
            tool_choice={"type": "function", "function": {"name": "get_weather", "x": 1}, "y": 2},
        )
        await env.queue(body)
        payload = (await pop_job(worker))["payload"]
        assert payload["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
        ]
        assert payload["tools"] == [WEATHER_TOOL]
        assert payload["tool_choice"] == "required"
