"""The reference worker (``hordelite worker``) against a real horde and the
fake OpenAI-compatible backend, driven in-process over real HTTP."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import jsonschema
import pytest
from PIL import Image
from sqlalchemy import select, update

from hordelite.cli import main
from hordelite.config import Config, WorkerConfig
from hordelite.contract.chat_reply import FAULT_REASONS
from hordelite.server import open_server
from hordelite.storage.schema import requests
from hordelite.storage.transaction import Tx
from hordelite.testing import (
    FakeBackendConfig,
    FakeChatWorker,
    open_fake_backend,
    open_horde,
)
from hordelite.worker import (
    PROBE_MESSAGES,
    Backoff,
    Worker,
    WorkerError,
    finish_reason,
    split_reasoning,
)
from hordelite.worker._backend import Backend, BackendError
from hordelite.worker.fake_backend import FakeBackend
from tests.integration._chat_helpers import WEATHER_TOOL, ChatEnv, chat_body, chat_status_path
from tests.integration._env import TLS, open_env, open_env_of
from tests.integration._helpers import eventually, worker_registered

pytestmark = pytest.mark.anyio

MODEL = "fake-model"  # the fake backend's model id
CHAT_ASYNC = "/api/v2/generate/chat/async"
TEXT_ASYNC = "/api/v2/generate/text/async"
WORD = re.compile(r"\s*\S+")  # the fake backend's token: a word with the space before it
OVERFLOW = "prompt_overflow_refused"
# A strict schema the fake backend's minimal instance ("x") does not match.
DIGITS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}},
    "required": ["code"],
    "additionalProperties": False,
}
COLOUR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"colour": {"type": "string"}, "shade": {"type": "integer", "minimum": 3}},
    "required": ["colour", "shade"],
    "additionalProperties": False,
}


def strict_schema(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


# The environment ------------------------------------------------------------------


class Env(ChatEnv):
    """The set-up, with a fake backend for the worker under test to call."""

    fake: FakeBackend

    def config(self, name: str = "w1", **keys: Any) -> WorkerConfig:
        """A validated worker configuration: fast retries and progress posts."""
        base = {
            "horde": self.horde.url,
            "key": self.owner,
            "name": name,
            "backend": self.fake.url,
            "backoff_initial": 0.01,
            "backoff_max": 0.05,
            "progress_interval": 0.02,
            "grace_period": 5,
        }
        return Config().replace(worker={**base, **keys}).worker

    async def chat(self, body: dict[str, Any]) -> str:
        """Queue a chat request; its id."""
        return await self.queue(body)

    async def status_when(
        self, request_id: str, ready: Callable[[dict[str, Any]], bool], path: str | None = None
    ) -> dict[str, Any]:
        """The request's status once ``ready`` holds (polled, with a deadline)."""
        with anyio.fail_after(10):
            while True:
                r = await self.client.get(path or chat_status_path(request_id))
                status: dict[str, Any] = r.json()
                if ready(status):
                    return status
                await anyio.sleep(0.01)

    async def done(self, request_id: str) -> dict[str, Any]:
        return await self.status_when(request_id, lambda s: s["done"] or s["faulted"])

    def generations(self) -> list[dict[str, Any]]:
        """The chat completion bodies the backend received, less the start probe's."""
        return [
            r["body"]
            for r in self.fake.requests
            if r["path"] == "/v1/chat/completions" and r["body"]["messages"] != list(PROBE_MESSAGES)
        ]


@contextlib.asynccontextmanager
async def environment(
    backend: FakeBackendConfig | None = None, *, config: Config | None = None, **horde: Any
) -> AsyncIterator[Env]:
    async with (
        open_env_of(Env, requester_kudos=100_000, config=config, **horde) as env,
        open_fake_backend(backend) as fake,
    ):
        env.fake = fake
        yield env


@contextlib.asynccontextmanager
async def serving(env: Env, config: WorkerConfig, **kwargs: Any) -> AsyncIterator[Worker]:
    """A started worker, online on the horde (it has popped once); stopped at exit."""
    worker = Worker(config, **kwargs)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.serve)
        try:
            await online(env, config.name)
            yield worker
        finally:
            worker.stop(0)


async def online(env: Env, name: str) -> None:
    await worker_registered(env.client, name)


def words(text: str) -> list[str]:
    return WORD.findall(text)


# Declaration ----------------------------------------------------------------------


async def test_a_worker_past_its_owners_workers_cap_stops_with_the_hordes_message() -> None:
    # Its operator must act (another name, or a higher cap): retrying would not help.
    capped = Config().replace(budgets={"workers_per_user": 1})
    async with environment(config=capped) as env:
        async with serving(env, env.config("w1")):
            pass
        with pytest.raises(WorkerError) as stopped:
            await Worker(env.config("w2")).serve()
        assert (await env.client.get("/api/v2/workers/name/w2")).status_code == 404
    assert str(stopped.value) == (
        "the horde refuses this worker's pops: 403 TooManyWorkers: This account has 1 worker "
        "registered and may have at most 1 (budgets.workers_per_user); worker 'w2' was not "
        "registered. Pop under the name of one of its workers, or ask the horde's operator "
        "for a higher limit."
    )


async def test_the_declaration_takes_the_model_and_context_from_the_backend_and_features_from_the_operator() -> (
    None
):
    async with environment(FakeBackendConfig(context=6144)) as env:
        config = env.config(features="tools,json_schema", max_length=300)
        async with serving(env, config):
            details = await env.worker_details("w1")
    assert details["models"] == [MODEL]
    assert details["max_context_length"] == 6144
    assert details["max_length"] == 300
    assert details["chat"] == {
        "model_id": MODEL,
        "features": ["tools", "json_schema", OVERFLOW],
        "limits": {"max_context_length": 6144, "max_length": 300},
        "image_transports": [],
    }


async def test_settings_override_the_model_id_and_context_and_declare_a_tools_temperature_clamp() -> (
    None
):
    async with environment(FakeBackendConfig(context=6144)) as env:
        config = env.config(model_id="my-model", context=2048, tools_max_temperature=1.0)
        async with serving(env, config):
            details = await env.worker_details("w1")
    assert details["models"] == ["my-model"]
    assert details["chat"]["model_id"] == "my-model"
    assert details["chat"]["limits"] == {
        "max_context_length": 2048,
        "max_length": 512,
        "tools_max_temperature": 1.0,
    }


# (fake backend settings, worker settings, declared?)
PROBE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    "exact counter, not short": ({"undercount": 0}, {}, True),
    "exact counter, short": ({"undercount": 3}, {}, False),
    "byte bound": ({"counter": False}, {}, True),
    "byte bound, no usage to measure the overhead": (
        {"counter": False, "report_usage": False},
        {},
        False,
    ),
    "byte bound, tools without a preamble size": ({"counter": False}, {"features": "tools"}, False),
    "byte bound, tools with a preamble size": (
        {"counter": False},
        {"features": "tools", "template_overhead": 400},
        True,
    ),
}


@pytest.mark.parametrize("case", list(PROBE_CASES))
async def test_prompt_overflow_refused_is_declared_only_when_the_probe_backs_the_fit_check(
    case: str,
) -> None:
    backend, settings, declared = PROBE_CASES[case]
    async with environment(FakeBackendConfig(**backend)) as env:
        async with serving(env, env.config(**settings)) as worker:
            details = await env.worker_details("w1")
        assert worker.declaration is not None
    assert (OVERFLOW in details["chat"]["features"]) is declared
    assert worker.declaration.guarantee.startswith("declared" if declared else "withheld")
    uses_bound = backend.get("counter") is False
    assert worker.declaration.fit.startswith("byte-length bound") is uses_bound


async def test_the_byte_bound_measures_the_template_overhead_on_the_probe() -> None:
    async with environment(FakeBackendConfig(counter=False, template_overhead=40)) as env:
        async with serving(env, env.config()) as worker:
            assert worker.declaration is not None
            # The probe's whole prompt is the measured overhead.
            measured = env.fake.prompt_tokens(list(PROBE_MESSAGES))
            assert worker.declaration.fit == (
                f"byte-length bound + {measured} tokens of template overhead"
            )


# Images ---------------------------------------------------------------------------


def png_data_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_chat_body(url: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": "What colour is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 32}


def sent_image_urls(env: Env) -> list[str]:
    return [
        part["image_url"]["url"]
        for body in env.generations()
        for message in body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


async def test_a_backend_that_reads_images_makes_the_worker_declare_vision_and_both_transports() -> (
    None
):
    async with environment(FakeBackendConfig(vision=True)) as env:
        async with serving(env, env.config()) as worker:
            details = await env.worker_details("w1")
    assert details["chat"]["features"] == ["vision", OVERFLOW]
    assert details["chat"]["image_transports"] == ["url", "base64"]
    assert worker.declaration is not None
    assert worker.declaration.image_transports == ("url", "base64")


async def test_an_image_reaches_the_backend_inline_as_the_jpeg_the_horde_stored() -> None:
    async with environment(FakeBackendConfig(vision=True)) as env, serving(env, env.config()):
        status = await env.done(await env.chat(image_chat_body(png_data_url())))
    assert status["done"] is True, status
    [url] = sent_image_urls(env)
    # The worker fetched the horde's signed URL and sent the bytes inline.
    prefix = "data:image/jpeg;base64,"
    assert url.startswith(prefix)
    with Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :]))) as image:
        assert (image.format, image.size) == ("JPEG", (64, 48))


async def test_an_image_sent_inline_by_the_horde_reaches_the_backend_as_is() -> None:
    async with environment(FakeBackendConfig(vision=True)) as env:
        async with serving(env, env.config()) as worker:
            # A base64-only declaration: the horde puts the JPEG in the pop.
            worker.declaration = dataclasses.replace(
                worker.declaration, image_transports=("base64",)
            )
            status = await env.done(await env.chat(image_chat_body(png_data_url())))
    assert status["done"] is True, status
    [url] = sent_image_urls(env)
    assert url.startswith("data:image/jpeg;base64,")


async def test_an_image_the_worker_cannot_fetch_faults_the_job_without_a_reason() -> None:
    async with environment(FakeBackendConfig(vision=True), max_faults=0) as env:
        async with serving(env, env.config()) as worker:
            # A cap below the stored JPEG's size: the fetch stops over it.
            assert worker._images is not None
            worker._images.max_bytes = 100
            status = await env.done(await env.chat(image_chat_body(png_data_url())))
            await eventually(lambda: worker.statistics().faulted == 1)
    assert status["faulted"] is True
    assert status["fault"]["rc"] == "ChatRequestFaulted"
    assert env.generations() == []


async def test_a_worker_whose_backend_reads_no_images_is_never_given_an_image_job() -> None:
    # No long-poll: the worker pops about every second.
    async with environment() as env, serving(env, env.config(wait=0)) as worker:
        r = await env.client.post(
            CHAT_ASYNC, headers={"apikey": env.requester}, json=image_chat_body(png_data_url())
        )
        # Queued, with the warning that no online worker declares vision;
        # it waits while the worker pops on without it.
        assert r.status_code == 202, r.text
        assert [w["code"] for w in r.json()["warnings"]] == ["NoAvailableWorker"]
        pops = worker.statistics().pops
        await eventually(lambda: worker.statistics().pops >= pops + 2)
        status = await env.status(r.json()["id"])
        assert (status["done"], status["faulted"]) == (False, False), status
        details = await env.worker_details("w1")
    assert "vision" not in details["chat"]["features"]
    assert details["chat"]["image_transports"] == []
    assert worker.statistics().jobs == 0
    assert env.generations() == []


# Text and chat jobs ---------------------------------------------------------------


async def test_a_text_job_goes_to_the_completions_route_with_its_samplers_and_its_text_is_submitted() -> (
    None
):
    async with environment() as env, serving(env, env.config()):
        params = {"max_length": 40, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "rep_pen": 1.1}
        r = await env.client.post(
            TEXT_ASYNC,
            headers={"apikey": env.requester},
            json={"prompt": "Once upon", "params": params, "models": [MODEL]},
        )
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        status = await env.status_when(
            request_id, lambda s: s["done"], f"/api/v2/generate/text/status/{request_id}"
        )
    assert status["generations"][0]["text"] == "echo: Once upon"
    [sent] = [r["body"] for r in env.fake.requests if r["path"] == "/v1/completions"]
    assert sent["prompt"] == "Once upon"
    assert sent["max_tokens"] == 40
    assert (sent["temperature"], sent["top_p"]) == (0.7, 0.9)
    # llama.cpp's names for the samplers OpenAI does not have.
    assert (sent["top_k"], sent["repeat_penalty"]) == (40, 1.1)


# A text prompt over the context: trimmed from its start (decision 0046).

TRIM_CONTEXT = 200  # the fake's context, and the payload's max_context_length
TRIM_MAX_LENGTH = 40


async def text_job(env: Env, prompt: str, max_context_length: int = TRIM_CONTEXT) -> dict[str, Any]:
    """Queue a native text request; its status once it ended."""
    params = {"max_length": TRIM_MAX_LENGTH, "max_context_length": max_context_length}
    r = await env.client.post(
        TEXT_ASYNC,
        headers={"apikey": env.requester},
        json={"prompt": prompt, "params": params, "models": [MODEL]},
    )
    assert r.status_code == 202, r.text
    request_id = r.json()["id"]
    path = f"/api/v2/generate/text/status/{request_id}"
    return await env.status_when(request_id, lambda s: s["done"] or s["faulted"], path)


def numbered_words(count: int) -> str:
    return " ".join(f"w{i:04d}" for i in range(count))


async def test_a_text_prompt_that_fits_by_its_bytes_is_sent_as_is_in_one_backend_call() -> None:
    config = FakeBackendConfig(context=TRIM_CONTEXT, overflow_error="llamacpp")
    async with environment(config) as env, serving(env, env.config(max_length=64)):
        before = len(env.fake.requests)
        prompt = "Once upon a time"
        status = await text_job(env, prompt)
        calls = env.fake.requests[before:]
    assert status["done"], status
    assert [c["path"] for c in calls] == ["/v1/completions"]
    assert calls[0]["body"]["prompt"] == prompt
    assert status["generations"][0]["text"] == f"echo: {prompt}"


async def test_a_text_prompt_over_the_context_keeps_its_last_tokens_counted_by_the_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    config = FakeBackendConfig(context=TRIM_CONTEXT, overflow_error="llamacpp")
    prompt = numbered_words(500)  # 3000 bytes: 750 of the fake's tokens
    limit = TRIM_CONTEXT - TRIM_MAX_LENGTH
    async with environment(config) as env, serving(env, env.config(max_length=64)):
        before = len(env.fake.requests)
        status = await text_job(env, prompt)
        calls = env.fake.requests[before:]
        tokens = env.fake.tokenize(prompt)
    assert status["done"], status
    # Counted once, then sent as the token ids it keeps: exactly the limit,
    # the END of the prompt.
    assert [c["path"] for c in calls] == ["/tokenize", "/v1/completions"]
    assert calls[0]["body"] == {"content": prompt, "add_special": True, "parse_special": True}
    sent = calls[1]["body"]["prompt"]
    assert len(tokens) == 750
    assert sent == tokens[-limit:]
    kept = env.fake.detokenize(sent)
    assert prompt.endswith(kept)
    assert kept.endswith("w0499")
    assert len(sent) + TRIM_MAX_LENGTH <= TRIM_CONTEXT
    assert status["generations"][0]["text"] == "".join(words(f"echo: {kept}")[:TRIM_MAX_LENGTH])
    assert any(f"trimmed from its start, 750 tokens to {limit}" in m for m in caplog.messages), (
        caplog.messages
    )


async def test_a_text_prompt_within_its_tokens_but_not_its_bytes_is_counted_and_sent_whole() -> (
    None
):
    config = FakeBackendConfig(context=TRIM_CONTEXT, overflow_error="llamacpp")
    prompt = "abcd" * 150  # 600 bytes but 150 of the fake's tokens: fits 160
    async with environment(config) as env, serving(env, env.config(max_length=64)):
        before = len(env.fake.requests)
        status = await text_job(env, prompt)
        calls = env.fake.requests[before:]
    assert status["done"], status
    assert [c["path"] for c in calls] == ["/tokenize", "/v1/completions"]
    assert calls[1]["body"]["prompt"] == prompt


async def test_without_a_tokenizer_a_text_prompt_over_the_context_keeps_its_last_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    # No /tokenize: cut by bytes, whole characters (two-byte ones here).
    config = FakeBackendConfig(context=TRIM_CONTEXT, counter=False, overflow_error="llamacpp")
    prompt = " ".join(f"mot{i}é" for i in range(300))
    limit = TRIM_CONTEXT - TRIM_MAX_LENGTH
    async with environment(config) as env, serving(env, env.config(max_length=64)):
        before = len(env.fake.requests)
        status = await text_job(env, prompt)
        calls = env.fake.requests[before:]
    assert any("cut to their last bytes" in m for m in caplog.messages)
    assert status["done"], status
    assert [c["path"] for c in calls] == ["/v1/completions"]
    sent = calls[0]["body"]["prompt"]
    assert isinstance(sent, str)
    assert prompt.endswith(sent)
    # limit - 2 bytes at most (BOS and a prefix token), one fewer where the
    # cut would split an "é".
    assert limit - 3 <= len(sent.encode()) <= limit - 2
    assert any(
        f"{len(prompt.encode())} bytes to {len(sent.encode())}" in m for m in caplog.messages
    )


async def test_a_chat_job_is_generated_with_every_sampling_field_as_sent_and_submitted_structured() -> (
    None
):
    async with environment() as env, serving(env, env.config(features="seed,presence_penalty")):
        body = chat_body(
            model=MODEL,
            max_tokens=64,
            temperature=0.3,
            top_p=0.9,
            presence_penalty=0.5,
            seed=7,
            stop=["\nuser:"],
        )
        status = await env.done(await env.chat(body))
    [sent] = env.generations()
    assert sent["messages"] == body["messages"]
    assert sent["max_tokens"] == 64
    for key in ("temperature", "top_p", "presence_penalty", "seed", "stop"):
        assert sent[key] == body[key], key
    assert sent["frequency_penalty"] == 0.0  # OpenAI's default, applied rather than the backend's
    # The backend samplers neutral, as the payload carries them.
    assert (sent["top_k"], sent["min_p"], sent["repeat_penalty"]) == (0, 0.0, 1.0)
    [generation] = status["generations"]
    answer = "echo: " + body["messages"][0]["content"]
    assert generation["message"] == {"role": "assistant", "content": answer}
    assert generation["finish_reason"] == "stop"
    assert generation["native_finish_reason"] == "stop"
    assert generation["prompt_tokens"] == env.fake.prompt_tokens(body["messages"])
    assert generation["completion_tokens"] == len(words(answer))
    assert generation["worker_name"] == "w1"


@pytest.mark.parametrize("report_usage", [True, False])
async def test_token_counts_are_submitted_only_when_the_backend_reports_them(
    report_usage: bool,
) -> None:
    async with environment(FakeBackendConfig(report_usage=report_usage)) as env:
        async with serving(env, env.config()):
            # Without usage the guarantee is withheld: only best_effort reaches it.
            body = chat_body(model=MODEL, horde={"conformance": "best_effort"})
            status = await env.done(await env.chat(body))
    [generation] = status["generations"]
    counts = (generation["prompt_tokens"], generation["completion_tokens"])
    if report_usage:
        answer = generation["message"]["content"]
        assert counts == (env.fake.prompt_tokens(body["messages"]), len(words(answer)))
    else:
        assert counts == (None, None)


async def test_a_tool_call_is_submitted_with_the_backend_id_and_a_null_content() -> None:
    async with environment() as env, serving(env, env.config(features="tools")):
        body = chat_body("What is the weather in Paris? call get_weather", model=MODEL)
        body["tools"] = [WEATHER_TOOL]
        status = await env.done(await env.chat(body))
    [generation] = status["generations"]
    message = generation["message"]
    assert message["content"] is None
    [call] = message["tool_calls"]
    # The fake numbers its calls over its life: this is its first.
    assert call["id"] == "call_1"
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER_TOOL["function"]["parameters"]
    )
    assert generation["finish_reason"] == "tool_calls"
    [sent] = env.generations()
    assert sent["tools"] == [WEATHER_TOOL]


async def test_a_strict_json_schema_request_is_answered_with_content_matching_the_schema() -> None:
    features = "json_schema,structured_output_enforced"
    async with environment() as env, serving(env, env.config(features=features)):
        body = chat_body(model=MODEL, response_format=strict_schema("colour", COLOUR_SCHEMA))
        status = await env.done(await env.chat(body))
    [generation] = status["generations"]
    assert generation["finish_reason"] == "stop"
    jsonschema.validate(json.loads(generation["message"]["content"]), COLOUR_SCHEMA)
    [sent] = env.generations()
    assert sent["response_format"] == body["response_format"]


async def test_a_closed_think_block_is_submitted_as_reasoning_content_apart_from_the_answer() -> (
    None
):
    reasoning = "The user wants a colour, so I name one."
    async with environment(FakeBackendConfig(reasoning=reasoning)) as env:
        async with serving(env, env.config()):
            body = chat_body(model=MODEL)
            status = await env.done(await env.chat(body))
    message = status["generations"][0]["message"]
    assert message["reasoning_content"] == reasoning
    assert message["content"] == "echo: " + body["messages"][0]["content"]


async def test_a_think_block_cut_at_max_length_is_reasoning_with_an_empty_content_and_length() -> (
    None
):
    reasoning = " ".join(f"thought{i}" for i in range(40))
    async with environment(FakeBackendConfig(reasoning=reasoning)) as env:
        async with serving(env, env.config()):
            status = await env.done(await env.chat(chat_body(model=MODEL, max_tokens=16)))
    [generation] = status["generations"]
    # Sixteen tokens: <think>, then the first fifteen words of the reasoning.
    assert generation["message"]["reasoning_content"] == "".join(words(reasoning)[:15]).strip()
    assert generation["message"]["content"] == ""
    assert generation["finish_reason"] == "length"


# Fit -----------------------------------------------------------------------------


COUNT = ["/apply-template", "/tokenize"]  # the exact count of a conversation
CHAT = "/v1/chat/completions"


def backend_calls(env: Env, since: int) -> list[str]:
    """The paths the backend was asked since ``since`` requests."""
    return [r["path"] for r in env.fake.requests[since:]]


async def test_a_conversation_that_does_not_fit_is_faulted_with_prompt_overflow_and_not_generated() -> (
    None
):
    # Three-byte characters: the horde's estimate (3 characters a token)
    # lets the request through, the backend's tokenizer counts more.
    async with environment(max_faults=0) as env, serving(env, env.config()) as worker:
        body = chat_body("色" * 6000, model=MODEL, max_tokens=512)
        needed = env.fake.prompt_tokens(body["messages"]) + 512
        assert needed > env.fake.config.context  # the premise
        since = len(env.fake.requests)
        status = await env.done(await env.chat(body))
        assert worker.statistics().overflows == 1
    assert status["faulted"] is True
    assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS["prompt_overflow"]}
    assert env.generations() == []
    # Past the bound: counted exactly, then faulted without generating.
    assert backend_calls(env, since) == COUNT


@pytest.mark.parametrize("stream", [False, True])
async def test_a_conversation_far_under_the_context_is_sent_in_one_backend_call(
    stream: bool,
) -> None:
    async with environment() as env, serving(env, env.config()):
        body = chat_body("Name one colour, in ünïcödé 日本語.", model=MODEL, max_tokens=64)
        body["messages"].insert(0, {"role": "system", "content": "Be brief."})
        if stream:
            body["stream"] = True
        since = len(env.fake.requests)
        for _ in range(3):
            status = await env.done(await env.chat(body))
            assert status["done"] is True
    assert backend_calls(env, since) == [CHAT] * 3


async def test_a_conversation_near_the_context_is_counted_exactly_then_generated() -> None:
    # 2000 three-byte characters: 6000 bytes, past what the byte bound can
    # clear in a 4096-token context; the tokenizer counts about 1500 tokens.
    async with environment() as env, serving(env, env.config()) as worker:
        assert worker._bound is not None
        body = chat_body("色" * 2000, model=MODEL, max_tokens=64)
        assert worker._bound.tokens(body) + 64 > env.fake.config.context  # type: ignore[operator]
        assert env.fake.prompt_tokens(body["messages"]) + 64 <= env.fake.config.context
        since = len(env.fake.requests)
        status = await env.done(await env.chat(body))
    assert status["done"] is True
    assert backend_calls(env, since) == [*COUNT, CHAT]


async def test_a_conversation_sent_uncounted_that_the_template_cannot_render_is_a_template_error() -> (
    None
):
    async with environment(max_faults=0) as env, serving(env, env.config()) as worker:

        def unrenderable(*_: Any) -> str:
            raise ValueError("the template raised: roles must alternate")

        env.fake.render = unrenderable  # type: ignore[method-assign]
        since = len(env.fake.requests)
        status = await env.done(await env.chat(chat_body("Hello", model=MODEL)))
        assert worker.statistics().faulted == 1
    assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS["template_error"]}
    # Sent in one call; its refusal then asks the counter why.
    assert backend_calls(env, since) == [CHAT, "/apply-template"]


async def test_a_worker_whose_counter_undercounts_measures_no_bound_and_counts_every_job() -> None:
    async with environment(FakeBackendConfig(undercount=3)) as env:
        async with serving(env, env.config()) as worker:
            assert worker._bound is None
            since = len(env.fake.requests)
            # Best effort: the worker withholds the guarantee a strict request needs.
            body = chat_body("Hello", model=MODEL, horde={"conformance": "best_effort"})
            status = await env.done(await env.chat(body))
    assert status["done"] is True
    assert backend_calls(env, since) == [*COUNT, CHAT]


async def test_a_tools_conversation_is_always_counted_exactly() -> None:
    async with environment() as env, serving(env, env.config(features="tools")):
        body = chat_body("What is the weather?", model=MODEL, tools=[WEATHER_TOOL])
        since = len(env.fake.requests)
        status = await env.done(await env.chat(body))
    assert status["done"] is True
    assert backend_calls(env, since) == [*COUNT, CHAT]


# Refusals --------------------------------------------------------------------------


async def test_a_refused_reply_is_faulted_with_reply_refused_and_never_resubmitted() -> None:
    features = "json_schema,structured_output_enforced"
    async with environment(max_faults=0) as env:
        async with serving(env, env.config(features=features)) as worker:
            body = chat_body(model=MODEL, response_format=strict_schema("code", DIGITS_SCHEMA))
            status = await env.done(await env.chat(body))
            # The worker counts the job once the horde has answered its fault.
            await eventually(lambda: worker.statistics().refused == 1)
            stats = worker.statistics()
            details = await env.worker_details("w1")
    assert status["faulted"] is True
    # The horde keeps the refusal's own message for a reply_refused fault.
    assert status["fault"]["rc"] == "ChatWorkerFault"
    assert status["fault"]["message"] != FAULT_REASONS["reply_refused"]
    assert "json_schema 'code'" in status["fault"]["message"]
    assert (stats.refused, stats.done, stats.jobs) == (1, 0, 1)
    assert len(env.generations()) == 1
    # The fault followed a nonconformant refusal of that job: counted as such.
    assert details["nonconformant_replies"] == 1
    assert details["uncompleted_jobs"] == 0


async def test_a_guarantee_is_withdrawn_after_repeated_nonconformant_refusals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    features = "json_schema,structured_output_enforced"
    # max_faults 2: the request comes back to the worker three times.
    async with environment(max_faults=2) as env:
        config = env.config(features=features, nonconformant_limit=3)
        async with serving(env, config) as worker:
            body = chat_body(model=MODEL, response_format=strict_schema("code", DIGITS_SCHEMA))
            status = await env.done(await env.chat(body))
            assert status["faulted"] is True
            await eventually(lambda: worker.statistics().refused == 3)
            assert worker.statistics().withdrawn == ("structured_output_enforced",)
            details = await env.status_when(
                "",
                lambda d: "structured_output_enforced" not in d["chat"]["features"],
                "/api/v2/workers/name/w1",
            )
            # A strict request needing it now waits: no worker declares it.
            waiting = await env.status(await env.chat(body))
    assert details["chat"]["features"] == ["json_schema", OVERFLOW]
    assert details["nonconformant_replies"] == 3
    assert waiting["is_possible"] is False
    assert waiting["impossible_reason"]["rc"] == "no_worker_supports_features"
    assert any("withdrawing structured_output_enforced" in m for m in caplog.messages)


# Streaming progress -------------------------------------------------------------------


async def test_a_streamed_job_posts_reasoning_and_content_apart_then_submits_the_whole_reply() -> (
    None
):
    reasoning = "Let me think about which colour to name here."
    async with environment(FakeBackendConfig(reasoning=reasoning, delay=0.02)) as env:
        async with serving(env, env.config()) as worker:
            body = chat_body(model=MODEL, stream=True)
            request_id = await env.chat(body)
            status = await env.status_when(request_id, lambda s: s["done"])
            posts = worker.statistics().progress_posts
    entries = await env.horde.horde.signals.read_progress(request_id, 0)
    assert posts == len(entries) >= 1
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    message = status["generations"][0]["message"]
    answer = "echo: " + body["messages"][0]["content"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, answer)
    posted_content = "".join(e["content"] for e in entries)
    posted_reasoning = "".join(e.get("reasoning_content") or "" for e in entries)
    assert answer.startswith(posted_content)
    assert reasoning.startswith(posted_reasoning)
    assert "<think>" not in posted_content + posted_reasoning
    [sent] = env.generations()
    assert sent["stream"] is True


async def test_a_streamed_job_posts_its_first_text_at_once_not_after_the_progress_interval() -> (
    None
):
    # 30 tokens at 50 ms: the reply takes about 1.5 s, the interval is a minute.
    prompt = " ".join(f"word{i}" for i in range(30))
    async with environment(FakeBackendConfig(delay=0.05)) as env:
        async with serving(env, env.config(progress_interval=60.0)) as worker:
            request_id = await env.chat(chat_body(prompt, model=MODEL, stream=True))
            signals = env.horde.horde.signals
            await eventually(lambda: signals.read_progress(request_id, 0))
            # Posted while the backend is still generating, not at its end.
            assert (await env.status(request_id))["done"] is False
            status = await env.status_when(request_id, lambda s: s["done"])
            posts = worker.statistics().progress_posts
    first = (await signals.read_progress(request_id, 0))[0]
    assert first["seq"] == 1
    assert first["content"]
    assert ("echo: " + prompt).startswith(first["content"])
    assert status["generations"][0]["message"]["content"] == "echo: " + prompt
    assert posts == 1  # the first text only: the next post would be a minute later


async def test_a_streamed_job_the_client_cancels_stops_generating_and_is_not_submitted() -> None:
    prompt = " ".join(f"word{i}" for i in range(300))  # 300 tokens at 20 ms: 6 s
    async with environment(FakeBackendConfig(delay=0.02)) as env:
        async with serving(env, env.config()) as worker:
            request_id = await env.chat(chat_body(prompt, model=MODEL, stream=True))
            signals = env.horde.horde.signals
            await eventually(lambda: signals.read_progress(request_id, 0))
            r = await env.client.delete(chat_status_path(request_id))
            assert r.status_code == 200, r.text
            # Well before the whole reply could have been generated.
            with anyio.fail_after(3):
                await eventually(lambda: worker.statistics().cancelled == 1)
            stats = worker.statistics()
            details = await env.worker_details("w1")
    assert (stats.done, stats.aborted, stats.faulted) == (0, 0, 0)
    assert stats.kudos == 0  # nothing submitted
    # The job was settled on the content posted before the cancel: the worker is paid.
    assert details["kudos_rewards"] > 0
    posted = "".join(e["content"] for e in await signals.read_progress(request_id, 0))
    full = "echo: " + prompt
    assert full.startswith(posted)
    assert len(posted) < len(full)


async def test_a_streamed_job_past_the_progress_cap_stops_posting_and_still_submits_its_reply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    # 16 tokens of 41 bytes: past the cap of 16 bytes per max_length token.
    prompt = " ".join(f"{i:02d}" + "x" * 38 for i in range(20))
    async with environment(FakeBackendConfig(delay=0.02)) as env:
        async with serving(env, env.config()) as worker:
            body = chat_body(prompt, model=MODEL, max_tokens=16, stream=True)
            request_id = await env.chat(body)
            status = await env.status_when(request_id, lambda s: s["done"])
            await eventually(lambda: worker.statistics().done == 1)
    full = "".join(words("echo: " + prompt)[:16])
    assert len(full.encode()) > 16 * 16  # the premise
    message = status["generations"][0]["message"]
    assert (message["content"], status["generations"][0]["finish_reason"]) == (full, "length")
    posted = "".join(
        e["content"] for e in await env.horde.horde.signals.read_progress(request_id, 0)
    )
    assert posted  # it posted until the cap refused a post
    assert len(posted.encode()) <= 16 * 16
    assert full.startswith(posted)
    stops = [m for m in caplog.messages if "progress posts stop" in m]
    assert len(stops) == 1
    assert "413 ChatProgressCapReached" in stops[0]


# Staying alive -------------------------------------------------------------------------


async def test_a_job_the_backend_fails_is_faulted_and_pops_resume_once_the_backend_answers() -> (
    None
):
    async with environment(max_faults=0) as env, serving(env, env.config()) as worker:
        env.fake.config.fail = True
        status = await env.done(await env.chat(chat_body(model=MODEL)))
        # Faulted without a reason: the generic fault.
        assert status["faulted"] is True
        assert status["fault"]["rc"] == "ChatRequestFaulted"
        await eventually(lambda: worker.statistics().faulted == 1)
        pops = worker.statistics().pops
        checked = len(env.fake.requests)
        # While the backend fails the worker checks its health, backing off, and does not pop.
        await eventually(
            lambda: sum(r["path"] == "/v1/models" for r in env.fake.requests[checked:]) >= 3
        )
        assert worker.statistics().pops == pops
        env.fake.config.fail = False
        status = await env.done(await env.chat(chat_body(model=MODEL)))
        assert status["done"] is True
        assert worker.statistics().backend_errors == 1


LONE_SURROGATE = "\ud800"  # valid in a Python str and in escaped JSON, not in UTF-8


async def spoil(env: Env, request_id: str) -> None:
    """Put a lone surrogate in a queued request's stop sequences, straight
    into storage: the horde stored such text before its boundary refused it,
    and no HTTP path reaches storage with it now."""

    def write(conn: Tx) -> None:
        row = conn.execute(
            select(requests.c.kind, requests.c.params, requests.c.chat).where(
                requests.c.id == request_id
            )
        ).one()
        if row.kind == "chat":
            values = {"chat": {**row.chat, "stop": [LONE_SURROGATE]}}
        else:
            values = {"params": {**row.params, "stop_sequence": ["ok", LONE_SURROGATE]}}
        conn.execute(update(requests).where(requests.c.id == request_id).values(**values))

    await env.horde.horde.db.write(write)


async def test_a_job_whose_text_cannot_be_encoded_is_faulted_once_and_25_in_an_hour_are_no_maintenance() -> (
    None
):
    spoiled = 25  # more than the 20 aborts an hour that mean maintenance
    async with environment() as env:
        config = env.config()
        # Another chat worker for the model, online for horde.worker_online
        # after a pop without wait: the requests are admitted before w1 runs.
        async with FakeChatWorker(env.horde.url, env.owner, name="w0", model_id=MODEL) as w0:
            await w0.pop()
        ids = []
        for _ in range(spoiled):
            ids.append(await env.chat(chat_body(model=MODEL, stop=["END"])))
            await spoil(env, ids[-1])
        async with serving(env, config) as worker:
            await eventually(lambda: worker.statistics().unsendable == spoiled)
            statuses = [await env.done(request_id) for request_id in ids]
            details = await env.worker_details("w1")
            # It keeps popping, and serves the next request.
            status = await env.done(await env.chat(chat_body(model=MODEL)))
            assert status["done"] is True
            stats = worker.statistics()
    assert (stats.jobs, stats.faulted, stats.unsendable, stats.done) == (
        spoiled + 1,
        spoiled,
        spoiled,
        1,
    )
    # Each request ended at its one fault, with the horde's own sentence.
    for faulted in statuses:
        assert (faulted["faulted"], faulted["restarted"]) == (True, 0)
        assert faulted["fault"]["rc"] == "ChatWorkerFault"
        assert "not valid Unicode" in faulted["fault"]["message"]
    # The request's text is not the worker's fault: nothing counts toward maintenance.
    assert details["maintenance_mode"] is False
    assert details["uncompleted_jobs"] == 0
    # The backend was never sent the unsendable jobs.
    assert len(env.generations()) == 1


async def test_a_text_job_whose_stop_sequence_cannot_be_encoded_is_faulted_and_the_worker_pops_on() -> (
    None
):
    async with environment() as env:
        config = env.config()
        async with serving(env, config):
            pass
        body = {"prompt": "Once upon", "params": {"max_length": 40}, "models": [MODEL]}
        r = await env.client.post(TEXT_ASYNC, headers={"apikey": "0000000000"}, json=body)
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        await spoil(env, request_id)
        path = f"/api/v2/generate/text/status/{request_id}"
        async with serving(env, config) as worker:
            faulted = await env.status_when(request_id, lambda s: s["faulted"], path)
            await eventually(lambda: worker.statistics().unsendable == 1)
            again = await env.client.post(TEXT_ASYNC, headers={"apikey": env.requester}, json=body)
            done_path = f"/api/v2/generate/text/status/{again.json()['id']}"
            done = await env.status_when(again.json()["id"], lambda s: s["done"], done_path)
            details = await env.worker_details("w1")
    assert faulted["restarted"] == 0
    assert done["generations"][0]["text"] == "echo: Once upon"
    assert details["uncompleted_jobs"] == 0
    assert [r["body"]["prompt"] for r in env.fake.requests if r["path"] == "/v1/completions"] == [
        "Once upon"
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_the_worker_retries_an_unreachable_horde_with_capped_backoff_and_serves_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    with tempfile.TemporaryDirectory(prefix="hordelite-") as tmp:
        database = str(Path(tmp) / "horde.db")
        async with open_horde(database=database) as first:  # the keys, before the outage
            requester = await first.create_key("alice", kudos=1000)
            owner = await first.create_key("bob")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with open_fake_backend() as fake:
            config = Config().replace(
                worker={
                    "horde": url,
                    "key": owner,
                    "name": "w1",
                    "backend": fake.url,
                    "backoff_initial": 0.01,
                    "backoff_max": 0.05,
                }
            )
            # No jitter: each delay is its ceiling.
            worker = Worker(config.worker, rng=lambda: 1.0)
            finished = anyio.Event()

            async def serve(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                try:
                    await worker.serve(task_status=task_status)
                finally:
                    finished.set()

            async with anyio.create_task_group() as tg:
                await tg.start(serve)
                await eventually(lambda: worker.statistics().horde_errors >= 6)
                horde_config = Config().replace(
                    server={"host": "127.0.0.1", "port": port, "grace_period": 2},
                    storage={"database": database},
                )
                async with (
                    open_server(horde_config),
                    httpx.AsyncClient(base_url=url, verify=TLS) as client,
                ):
                    await worker_registered(client, "w1")
                    r = await client.post(
                        CHAT_ASYNC, headers={"apikey": requester}, json=chat_body(model=MODEL)
                    )
                    assert r.status_code == 202, r.text
                    status_path = chat_status_path(r.json()["id"])
                    with anyio.fail_after(10):
                        while True:
                            if (await client.get(status_path)).json()["done"]:
                                break
                            await anyio.sleep(0.01)
                    # The worker ends before the horde stops: what it says as
                    # it stops reaches a horde still serving.
                    worker.stop(0)
                    await finished.wait()
    delays = [
        float(m.group(1))
        for m in map(re.compile(r"popping again in ([0-9.]+) s").search, caplog.messages)
        if m
    ]
    assert len(delays) >= 6
    # Doubling from backoff_initial, capped at backoff_max.
    assert delays == [min(0.05, 0.01 * 2**n) for n in range(len(delays))]
    assert any("the horde answers again" in m for m in caplog.messages)
    assert worker.statistics().done == 1


def test_backoff_doubles_up_to_its_cap_and_jitters_between_half_and_the_whole_delay() -> None:
    ceilings = [min(8.0, 0.5 * 2**n) for n in range(8)]
    assert [Backoff(0.5, 8.0, rng=lambda: 1.0).delay(n) for n in range(8)] == ceilings
    assert [Backoff(0.5, 8.0, rng=lambda: 0.0).delay(n) for n in range(8)] == [
        c / 2 for c in ceilings
    ]
    assert Backoff(0.5, 8.0).delay(5000) <= 8.0  # no overflow far past the cap


async def test_stop_lets_a_job_in_hand_finish_within_the_grace_period() -> None:
    async with environment() as env:
        worker = Worker(env.config())
        async with anyio.create_task_group() as tg:
            await tg.start(worker.serve)
            await online(env, "w1")
            env.fake.config.delay = 0.2  # after the start probe
            request_id = await env.chat(chat_body(model=MODEL))
            await eventually(lambda: bool(env.generations()))
            stopped_at = anyio.current_time()
            worker.stop(5)
        elapsed = anyio.current_time() - stopped_at
        status = await env.status(request_id)
    assert status["done"] is True
    assert worker.statistics().done == 1
    assert elapsed < 5


async def test_stop_faults_a_job_still_running_when_the_grace_period_ends() -> None:
    async with environment() as env:
        worker = Worker(env.config())
        async with anyio.create_task_group() as tg:
            await tg.start(worker.serve)
            await online(env, "w1")
            env.fake.config.delay = 30  # after the start probe
            request_id = await env.chat(chat_body(model=MODEL))
            await eventually(lambda: bool(env.generations()))
            stopped_at = anyio.current_time()
            worker.stop(0.2)
        elapsed = anyio.current_time() - stopped_at
        status = await env.status(request_id)
    # Faulted at once: the request is back in the queue for another worker.
    assert status["restarted"] == 1
    assert (status["done"], status["faulted"], status["processing"]) == (False, False, 0)
    assert worker.statistics().faulted == 1
    assert 0.2 <= elapsed < 3


# Starting --------------------------------------------------------------------------


async def test_the_worker_says_it_serves_only_once_the_horde_answered_a_pop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    async with environment() as env:
        async with serving(env, env.config()):
            await eventually(lambda: any("serving 'fake-model'" in m for m in caplog.messages))
    starting = [i for i, m in enumerate(caplog.messages) if "starting: popping for" in m]
    serving_lines = [i for i, m in enumerate(caplog.messages) if "serving 'fake-model'" in m]
    assert len(starting) == 1, caplog.messages
    assert len(serving_lines) == 1, caplog.messages  # once, not at every pop
    assert starting[0] < serving_lines[0]


async def test_a_refused_key_stops_the_worker_with_one_clear_error_and_no_claim_to_serve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    async with environment() as env:
        worker = Worker(env.config(key="no-such-key-1234"))
        with pytest.raises(WorkerError) as info:
            await worker.serve()
    message = str(info.value)
    assert "\n" not in message
    for words in ("refuses the worker's key", "401 InvalidAPIKey", "HORDELITE_WORKER_KEY"):
        assert words in message, message
    assert not [m for m in caplog.messages if "serving 'fake-model'" in m]
    assert not [m for m in caplog.messages if "summary" in m]  # nothing served to sum up


@pytest.mark.parametrize("suffix", ["/api/v2", "/api/v2/", "/v1", "/api/"])
async def test_a_horde_url_with_an_api_route_is_corrected_with_a_note(
    caplog: pytest.LogCaptureFixture, suffix: str
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.worker")
    async with environment() as env:
        config = env.config(horde=env.horde.url + suffix)
        async with serving(env, config) as worker:
            assert worker.config.horde == env.horde.url
    notes = [m for m in caplog.messages if "not part of the horde's base URL" in m]
    assert len(notes) == 1, caplog.messages
    assert f"using {env.horde.url}" in notes[0]


async def test_a_horde_url_that_finds_no_route_is_refused_in_one_line_naming_the_base_url() -> None:
    async with environment() as env:
        url = env.horde.url + "/not-the-horde"
        with pytest.raises(WorkerError) as info:
            await Worker(env.config(horde=url)).serve()
    message = str(info.value)
    assert "404 NotFound" in message
    assert f"is {url} the horde's base URL?" in message


# The command -------------------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No ./hordelite.toml, no HORDELITE_ configuration; the environment for a child."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("HORDELITE_"):
            monkeypatch.delenv(name)
    return dict(os.environ)


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--features", "tools,vision"], "worker.features"),
        (["--features", "tools,prompt_overflow_refused"], "worker.features"),
        (["--threads", "0"], "worker.threads"),
        (["--horde", "ftp://example"], "worker.horde"),
        (["--max-length", "5000"], "worker.max_length"),
    ],
)
def test_a_bad_worker_flag_stops_the_command_naming_its_key(
    flags: list[str], key: str, isolated: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "--key", "k", "--name", "n", "--backend", "fake", *flags]
    assert main(argv) == 2
    assert key in capsys.readouterr().err


def test_the_worker_command_needs_a_key(
    isolated: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--name", "n", "--backend", "fake"]) == 2
    assert "worker.key" in capsys.readouterr().err


async def test_the_worker_command_serves_the_fake_backend_and_exits_0_on_sigint(
    isolated: dict[str, str], tmp_path: Path
) -> None:
    async with (
        open_env() as env,
        httpx.AsyncClient(base_url=env.horde.url, verify=TLS) as client,
    ):
        command = [sys.executable, "-m", "hordelite", "worker", "--horde", env.horde.url]
        # --key=: a key may start with "-", which argparse would take for a flag.
        command += [f"--key={env.owner}", "--name", "cli-worker", "--backend", "fake"]
        async with await anyio.open_process(command, cwd=tmp_path, env=isolated) as process:
            output = bytearray()

            async def read() -> None:
                assert process.stderr is not None
                async for chunk in process.stderr:
                    output.extend(chunk)

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                with anyio.move_on_after(30):
                    while (await client.get("/api/v2/workers/name/cli-worker")).status_code != 200:
                        assert process.returncode is None, output.decode()
                        await anyio.sleep(0.02)
                assert process.returncode is None, output.decode()
                process.send_signal(signal.SIGINT)
                with anyio.move_on_after(30):
                    code = await process.wait()
                if process.returncode is None:
                    process.kill()
                    pytest.fail(f"the worker did not stop on SIGINT:\n{output.decode()}")
    assert code == 0, output.decode()
    log = output.decode()
    assert "declaring chat features: prompt_overflow_refused" in log
    assert "final summary" in log


async def test_the_worker_command_takes_its_key_from_the_environment_and_a_refused_one_is_one_line(
    isolated: dict[str, str], tmp_path: Path
) -> None:
    async with open_horde() as horde:
        command = [sys.executable, "-m", "hordelite", "worker", "--horde", horde.url]
        command += ["--name", "cli-worker", "--backend", "fake"]
        env = {**isolated, "HORDELITE_WORKER_KEY": "not-a-key-of-this-horde"}
        with anyio.fail_after(60):
            done = await anyio.run_process(command, cwd=tmp_path, env=env, check=False)
    err = done.stderr.decode()
    # The key was read (no "worker.key is required"), sent, and refused.
    assert done.returncode == 1, err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("hordelite worker: the horde at"), err
    assert "401 InvalidAPIKey" in last
    assert "HORDELITE_WORKER_KEY" in last
    assert "serving 'fake-model'" not in err
    assert "Traceback" not in err


def test_the_worker_help_says_to_prefer_the_environment_for_the_key(
    isolated: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--help"]) == 0
    assert "prefer the environment variable HORDELITE_WORKER_KEY" in " ".join(
        capsys.readouterr().out.split()
    )


def test_the_worker_package_exports_its_public_surface() -> None:
    import hordelite.worker

    assert sorted(hordelite.worker.__all__) == [
        "Backoff",
        "Declaration",
        "PROBE_MESSAGES",
        "Worker",
        "WorkerError",
        "WorkerStatistics",
        "finish_reason",
        "split_reasoning",
    ]


async def test_llama_cpps_refusal_of_a_prompt_over_its_context_carries_its_type_as_the_code() -> (
    None
):
    # llama.cpp's server refuses a prompt over its context with its type in
    # "type" (the fake backend answers as it does with overflow_error="llamacpp").
    config = FakeBackendConfig(context=64, overflow_error="llamacpp")
    async with open_fake_backend(config) as fake:
        backend = Backend(fake.url, 5)
        try:
            with pytest.raises(BackendError) as refused:
                await backend.chat({"messages": [{"role": "user", "content": "word " * 400}]})
        finally:
            await backend.aclose()
    assert refused.value.code == "exceed_context_size_error"
    assert (refused.value.status, refused.value.down) == (400, False)


# Pure parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "<think>I weigh red and blue.</think>\n\nBlue.",
        "  <think>\nunfinished thought that never",
        "Plain answer, no thinking.",
        "<thinker> is not a tag",
    ],
)
def test_split_reasoning_while_streaming_only_ever_extends_what_it_showed(raw: str) -> None:
    shown = ("", "")
    for end in range(len(raw) + 1):
        reasoning, content = split_reasoning(raw[:end], final=False)
        assert reasoning.startswith(shown[0]), raw[:end]
        assert content.startswith(shown[1]), raw[:end]
        shown = (reasoning, content)
    final_reasoning, final_content = split_reasoning(raw)
    assert final_content.startswith(shown[1])
    assert "<think>" not in final_content + final_reasoning


def test_split_reasoning_splits_a_closed_block_and_keeps_an_unclosed_one_as_reasoning() -> None:
    assert split_reasoning("<think>red or blue</think>\nBlue.") == ("red or blue", "Blue.")
    assert split_reasoning("<think>red or bl") == ("red or bl", "")
    assert split_reasoning("Blue.") == ("", "Blue.")


@pytest.mark.parametrize(
    ("native", "calls", "expected"),
    [
        ("stop", False, "stop"),
        ("eos", False, "stop"),
        (None, False, "stop"),
        ("length", False, "length"),
        ("max_tokens", False, "length"),
        ("content_filter", False, "content_filter"),
        ("tool_calls", True, "tool_calls"),
        ("tool_calls", False, "stop"),
        ("stop", True, "stop"),  # a forced choice may finish with stop and calls
    ],
)
def test_finish_reasons_map_onto_the_four_the_horde_accepts(
    native: str | None, calls: bool, expected: str
) -> None:
    assert finish_reason(native, calls) == expected
