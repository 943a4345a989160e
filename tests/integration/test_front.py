"""The OpenAI-compatible front driven by the official ``openai`` SDK over real
HTTP (issue 4; chat guide: "A separate front woken by Redis", "Errors in the
OpenAI envelope", "What a client can rely on" and the availability table).

Every error is checked three ways: the HTTP status, the envelope
``{"error": {"message", "type", "param", "code", "metadata"}}`` and the SDK's
exception class. AsyncOpenAI runs on trio as well as asyncio (its HTTP client
and its retry sleeps go through anyio), so every test runs on both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.storage import queries as q
from hordelite.testing import FakeChatWorker
from tests.chat_shapes import json_schema_format
from tests.integration._chat_helpers import (
    MODEL,
    STRICT,
    WEATHER_TOOL,
    ChatEnv,
    chat_body,
    open_chat_horde,
    pop_job,
    pop_nothing,
)
from tests.integration._env import TLS
from tests.integration._helpers import eventually

pytestmark = pytest.mark.anyio

DEFAULTS = Config()
# The third fault of a request ends it (horde.max_faults, default 2).
MAX_FAULTS = DEFAULTS.horde.max_faults
# The SDK's own default: an error it may retry is sent up to 3 times.
SDK_DEFAULT_RETRIES = 2
CHAT = "/v1/chat/completions"
# The keys of the front's error object (chat guide: "Errors in the OpenAI envelope").
ENVELOPE_KEYS = {"message", "type", "param", "code", "metadata"}


# Helpers ---------------------------------------------------------------------


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def text_reply(content: str, **fields: Any) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop", **fields}


def chat_request(content: str = "Name one colour.", **fields: Any) -> dict[str, Any]:
    """The arguments of a call for MODEL with one user message, at most 64
    tokens; ``fields`` add arguments or replace these."""
    return {"model": MODEL, "messages": [user(content)], "max_tokens": 64, **fields}


async def refusal(
    client: openai.AsyncOpenAI,
    raises: type[openai.APIStatusError] = openai.APIStatusError,
    **fields: Any,
) -> openai.APIStatusError:
    """The error (``raises`` or a subclass) the SDK raises for the call
    ``chat_request(**fields)``; fails the test if the call is answered."""
    with pytest.raises(raises) as caught:
        await client.chat.completions.create(**chat_request(**fields))
    return caught.value


async def answered(
    client: openai.AsyncOpenAI, serve: Callable[..., Awaitable[object]], *args: Any, **fields: Any
) -> ChatCompletion:
    """The completion of the call ``chat_request(**fields)``, made while
    ``serve(*args)`` (the worker's side) runs beside it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, *args)
        return await client.chat.completions.create(**chat_request(**fields))


async def streamed(
    client: openai.AsyncOpenAI, serve: Callable[..., Awaitable[object]], *args: Any, **fields: Any
) -> list[ChatCompletionChunk]:
    """Every chunk of the streamed call ``chat_request(stream=True, **fields)``,
    read through the SDK's stream while ``serve(*args)`` runs beside it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, *args)
        stream = await client.chat.completions.create(**chat_request(stream=True, **fields))
        return [chunk async for chunk in stream]


@dataclasses.dataclass
class Front:
    """A running horde with funded requester, a worker owner, and SDK clients
    whose every POST to /v1/chat/completions is counted in ``sent``."""

    env: ChatEnv
    sent: list[httpx.Request] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return self.env.horde.url

    @property
    def http(self) -> httpx.AsyncClient:
        return self.env.client

    @property
    def bearer(self) -> dict[str, str]:
        """The requester's key in the header the OpenAI clients send."""
        return {"Authorization": f"Bearer {self.env.requester}"}

    def open_stream(
        self, body: dict[str, Any]
    ) -> contextlib.AbstractAsyncContextManager[httpx.Response]:
        """A streamed call, raw, with the requester's key: its response is
        open while the block runs."""
        return self.http.stream("POST", CHAT, headers=self.bearer, json=body)

    async def sdk(
        self, *, api_key: str | None = None, max_retries: int = SDK_DEFAULT_RETRIES
    ) -> openai.AsyncOpenAI:
        async def count(request: httpx.Request) -> None:
            if request.url.path == CHAT:
                self.sent.append(request)

        http = await self.env.stack.enter_async_context(
            httpx.AsyncClient(event_hooks={"request": [count]}, verify=TLS, timeout=30)
        )
        client = openai.AsyncOpenAI(
            base_url=self.url + "/v1",
            api_key=api_key or self.env.requester,
            max_retries=max_retries,
            http_client=http,
        )
        return await self.env.stack.enter_async_context(client)

    async def worker(
        self, name: str, features: Sequence[str] = STRICT, **kwargs: Any
    ) -> FakeChatWorker:
        """An online chat worker for MODEL (it pops once, finding nothing)."""
        return await self.env.chat_worker(name, features, **kwargs)

    async def worker_id(self, name: str) -> str:
        return str((await self.env.worker_details(name))["id"])

    async def queued(self) -> int:
        """Jobs waiting in the queue, read from the horde's database."""
        stats = await self.env.horde.horde.db.read(q.model_queue_stats)
        return sum(jobs for jobs, _ in stats.values())

    async def until_queued(self, jobs: int) -> None:
        """Until ``jobs`` jobs wait in the queue (fails past a deadline)."""

        async def reached() -> bool:
            return await self.queued() == jobs

        await eventually(reached)

    async def leave_once_queued(self, call: Callable[..., Awaitable[object]]) -> None:
        """Start a client's ``call`` (with ``tg.start``: it says when it is
        under way) and cancel it once its request waits in the queue, as a
        client that goes away while its call waits for a worker; returns
        once the queue is empty again."""
        async with anyio.create_task_group() as tg:
            await tg.start(call)
            await self.until_queued(1)
            tg.cancel_scope.cancel()
        await self.until_queued(0)

    async def assert_cancelled(self, request_id: str) -> None:
        """The horde request ended without a reply and left the queue."""
        status = await self.env.status(request_id)
        assert status["done"] is True, status
        assert status["faulted"] is False, status
        assert status["generations"] == [], status
        assert status["waiting"] == 0, status
        assert await self.queued() == 0


@contextlib.asynccontextmanager
async def open_front(front: dict[str, Any] | None = None, **horde: Any) -> AsyncIterator[Front]:
    """A horde whose [front] section has ``front`` keys; ``horde`` keys go to
    open_horde (its [horde] section, or ``clock``)."""
    config = Config().replace(front=front) if front else None
    async with open_chat_horde(config=config, **horde) as env:
        yield Front(env)


@contextlib.asynccontextmanager
async def open_served_front(
    front: dict[str, Any] | None = None, **horde: Any
) -> AsyncIterator[tuple[Front, FakeChatWorker, openai.AsyncOpenAI]]:
    """``open_front`` with one online chat worker, w1, and an SDK client with
    the requester's key: the set-up of a call for one worker to serve."""
    async with open_front(front, **horde) as opened:
        yield opened, await opened.worker("w1"), await opened.sdk()


def assert_error(
    exc: openai.APIStatusError,
    cls: type[openai.APIStatusError],
    status: int,
    code: str,
    *,
    held: bool,
    param: str | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """The SDK raised exactly ``cls`` for this status, the body is the front's
    envelope with ``code``, and ``x-should-retry: false`` is there exactly when
    the horde may hold the request (``held``, and then the metadata names the
    request). Returns the error object."""
    assert type(exc) is cls, repr(exc)
    assert exc.status_code == status
    body = exc.response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == ENVELOPE_KEYS, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["param"] == param, error
    assert isinstance(error["type"], str)
    assert error["type"]
    if kind is not None:
        assert error["type"] == kind, error
    # The SDK read the same envelope.
    assert exc.code == code
    assert exc.message == f"Error code: {status} - {error['message']}"
    if held:
        assert exc.response.headers.get("x-should-retry") == "false"
        assert error["metadata"]["request_id"], error
    else:
        # Nothing is held, so a retry cannot charge twice: the SDK may retry.
        assert exc.response.headers.get("x-should-retry") != "false"
    return error


async def no_worker_of_model(front: Front, clock: ManualClock) -> FakeChatWorker:
    """A chat worker that served MODEL once (so the horde knows the model)
    and has since gone offline; returned to come back online later."""
    worker = await front.worker("gone")
    clock.advance(DEFAULTS.horde.worker_online + 1)
    return worker


async def outside_worker_list(front: Front) -> tuple[FakeChatWorker, dict[str, Any]]:
    """An eligible chat worker online and a request restricted to another
    worker, which is online but serves no chat: no online worker may take
    the request, and not for a declaration or limit gap. Returns the listed
    worker as a chat worker (offline for chat until it pops) and the
    request's ``horde`` object."""
    await front.worker("w1")
    listed = await front.env.text_worker("listed")
    await pop_nothing(listed)
    horde = {"workers": [await front.worker_id("listed")]}
    return await front.worker("listed", online=False), horde


# A plain completion ------------------------------------------------------------


async def test_a_completion_is_chatcmpl_of_the_request_id_with_the_served_model_usage_and_x_horde() -> (
    None
):
    async with open_served_front() as (front, worker, client):
        completion = await answered(client, worker.serve_one)
        x_horde = completion.model_extra["x_horde"]  # type: ignore[index]
        request_id = x_horde["request_id"]
        assert completion.id == f"chatcmpl-{request_id}"
        assert completion.object == "chat.completion"
        assert completion.model == MODEL
        assert len(completion.choices) == 1
        choice = completion.choices[0]
        assert choice.index == 0
        assert choice.finish_reason == "stop"
        assert choice.message.role == "assistant"
        # The fake worker answers "reply to: <the last user message>".
        assert choice.message.content == "reply to: Name one colour."
        assert choice.message.tool_calls is None
        # The native status of the same id holds the same reply and charge.
        status = await front.env.status(request_id)
        assert status["done"] is True
        assert status["generations"][0]["message"]["content"] == choice.message.content
        assert x_horde == {
            "request_id": request_id,
            "kudos": status["kudos"],
            "charge_basis": "output_estimate",
            "worker": {"id": await front.worker_id("w1"), "name": "w1"},
            "model": MODEL,
            # The fake worker reported no token counts.
            "estimated_usage": True,
        }
        assert status["kudos"] > 0
        usage = completion.usage
        assert usage is not None
        assert usage.prompt_tokens > 0
        assert usage.completion_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 0


async def test_usage_is_the_workers_reported_counts_and_not_estimated_when_it_reported_them_all() -> (
    None
):
    reply = {
        "message": {
            "role": "assistant",
            "content": "Blue.",
            "reasoning_content": "A colour is asked for; blue is one.",
        },
        "finish_reason": "stop",
        "prompt_tokens": 17,
        "completion_tokens": 9,
        "reasoning_tokens": 6,
    }
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: reply)
        client = await front.sdk()
        completion = await answered(client, worker.serve_one)
        usage = completion.usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (17, 9, 26)
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 6
        assert completion.model_extra["x_horde"]["estimated_usage"] is False  # type: ignore[index]
        message = completion.choices[0].message
        assert message.content == "Blue."
        assert message.model_extra["reasoning_content"] == reply["message"]["reasoning_content"]  # type: ignore[index]


async def test_include_reasoning_false_leaves_the_reasoning_out_of_the_message() -> None:
    reply = {
        "message": {"role": "assistant", "content": "Blue.", "reasoning_content": "Thinking."},
        "finish_reason": "stop",
    }
    async with open_front() as front:
        worker = await front.worker("w1", reply=lambda job: reply)
        client = await front.sdk()
        completion = await answered(
            client, worker.serve_one, extra_body={"horde": {"include_reasoning": False}}
        )
        message = completion.choices[0].message
        assert message.content == "Blue."
        assert "reasoning_content" not in (message.model_extra or {})
        # The native status shows it either way.
        status = await front.env.status(completion.model_extra["x_horde"]["request_id"])  # type: ignore[index]
        assert status["generations"][0]["message"]["reasoning_content"] == "Thinking."


# Tools and structured output -------------------------------------------------------


async def test_a_tool_call_reply_and_the_follow_up_turn_with_the_tool_result() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        if len(jobs) == 1:
            return {
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        return text_reply("Take no umbrella: 18 C and sunny.")

    async with open_front() as front:
        worker = await front.worker("w1", ("tools", *STRICT), reply=reply)
        client = await front.sdk()
        messages: list[Any] = [user("What is the weather in Paris?")]
        first = await answered(client, worker.serve_one, messages=messages, tools=[WEATHER_TOOL])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None
        assert len(choice.message.tool_calls) == 1
        parsed = choice.message.tool_calls[0]
        assert parsed.id == "call_1"
        assert parsed.type == "function"
        assert parsed.function.name == "get_weather"
        assert json.loads(parsed.function.arguments) == {"city": "Paris"}

        # The SDK's usual tool loop: the assistant message object as returned,
        # then the tool's result.
        messages.append(choice.message)
        messages.append({"role": "tool", "tool_call_id": parsed.id, "content": "18 C and sunny"})
        second = await answered(client, worker.serve_one, messages=messages, tools=[WEATHER_TOOL])
        assert second.choices[0].message.content == "Take no umbrella: 18 C and sunny."
        assert second.choices[0].finish_reason == "stop"
        history = jobs[1]["payload"]["messages"]
        assert [m["role"] for m in history] == ["user", "assistant", "tool"]
        assert history[1]["tool_calls"] == [call]
        assert history[2]["tool_call_id"] == "call_1"
        assert history[2]["content"] == "18 C and sunny"


class Colour(pydantic.BaseModel):
    name: str
    hex: str


async def test_a_strict_json_schema_reply_reaches_the_sdk_parsed() -> None:
    content = '{"name": "blue", "hex": "#0000ff"}'
    jobs: list[dict[str, Any]] = []

    def reply(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        return text_reply(content)

    async with open_front() as front:
        # Exactly what a strict json_schema request needs (the conformance decision).
        features = ("json_schema", "structured_output_enforced", "prompt_overflow_refused")
        worker = await front.worker("w1", features, reply=reply)
        client = await front.sdk()
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve_one)
            # parse() sends the model as a strict json_schema response_format.
            completion = await client.chat.completions.parse(
                model=MODEL,
                messages=[user("Name one colour with its hex code.")],
                response_format=Colour,
                max_tokens=64,
            )
        message = completion.choices[0].message
        assert message.content == content
        assert message.parsed == Colour(name="blue", hex="#0000ff")
        response_format = jobs[0]["payload"]["response_format"]
        assert response_format["type"] == "json_schema"
        assert response_format["json_schema"]["strict"] is True


# A refused reply that faults the request ----------------------------------------------


async def refuse_until_the_request_faults(worker: FakeChatWorker, reply: dict[str, Any]) -> str:
    """Pop the request's job MAX_FAULTS + 1 times, each time submitting a
    reply the horde refuses as nonconformant, then faulting with
    reply_refused. Returns the refusal's message."""
    messages = set()
    for _ in range(MAX_FAULTS + 1):
        job = await worker.pop(wait=10)
        assert job["id"] is not None
        refused = await worker.submit_reply(job, reply)
        assert refused.status_code == 400, refused.text
        assert refused.json()["rc"] == "ChatSubmitNonconformant"
        messages.add(refused.json()["message"])
        faulted = await worker.fault(job, "reply_refused")
        assert faulted.status_code == 200, faulted.text
    (message,) = messages
    return str(message)


STRICT_SCHEMA = json_schema_format("colour", ["name"])
SCHEMA_FEATURES = ("json_schema", "structured_output_enforced", "prompt_overflow_refused")


async def test_a_request_faulted_by_refused_replies_is_a_502_with_the_refusals_message() -> None:
    async with open_front() as front:
        worker = await front.worker("w1", SCHEMA_FEATURES)
        client = await front.sdk()
        refusals: list[str] = []

        async def work() -> None:
            refusals.append(await refuse_until_the_request_faults(worker, text_reply("Blue.")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            refused = await refusal(client, response_format=STRICT_SCHEMA)
        error = assert_error(
            refused, openai.InternalServerError, 502, "ChatRequestFaulted", held=True
        )
        assert error["message"] == refusals[0]
        assert error["metadata"]["worker_rc"] == "ChatWorkerFault"
        status = await front.env.status(error["metadata"]["request_id"])
        assert status["faulted"] is True
        assert status["fault"]["message"] == refusals[0]
        # A faulted request charges nobody.
        assert status["kudos"] == 0


# The availability table ------------------------------------------------------------------


async def test_a_model_without_an_online_chat_worker_is_refused_503_no_eligible_worker_and_nothing_queued() -> (
    None
):
    clock = ManualClock()
    async with open_front(clock=clock) as front:
        gone = await no_worker_of_model(front, clock)
        client = await front.sdk(max_retries=0)
        refused = await refusal(client)
        # Refused before anything was queued: a retry would be harmless.
        assert_error(
            refused,
            openai.InternalServerError,
            503,
            "no_eligible_worker",
            held=False,
            param="model",
        )
        assert await front.queued() == 0
        await pop_nothing(gone)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_missing_declaration_is_refused_404_no_worker_supports_features_and_cancelled(
    stream: bool,
) -> None:
    async with open_front() as front:
        await front.worker("w1")  # serves the model, declares no tools
        client = await front.sdk()
        # A refusal at the first status read comes before any stream opens.
        refused = await refusal(
            client, content="What is the weather in Paris?", tools=[WEATHER_TOOL], stream=stream
        )
        error = assert_error(
            refused, openai.NotFoundError, 404, "no_worker_supports_features", held=True
        )
        assert len(front.sent) == 1
        await front.assert_cancelled(error["metadata"]["request_id"])
        # A worker that could serve it now finds nothing.
        late = await front.worker("w2", ("tools", *STRICT), online=False)
        await pop_nothing(late)


async def test_only_a_size_limit_exceeded_is_refused_400_no_worker_supports_limit() -> None:
    limits = {"max_context_length": 1024, "max_length": 256}
    async with open_front() as front:
        await front.worker("w1", limits=limits)
        client = await front.sdk()
        # At 3 characters a token, over the worker's whole context.
        content = "word " * (3 * limits["max_context_length"] // 5 + 1)
        refused = await refusal(client, content=content)
        assert_error(
            refused,
            openai.BadRequestError,
            400,
            "no_worker_supports_limit",
            held=False,
            param="messages",
        )
        assert await front.queued() == 0


async def test_no_eligible_worker_past_the_grace_is_a_503_and_cancels_the_request() -> None:
    async with open_front({"no_worker_grace": 0.5, "recheck_interval": 0.2}) as front:
        listed, horde = await outside_worker_list(front)
        client = await front.sdk()
        refused = await refusal(client, extra_body={"horde": horde})
        error = assert_error(
            refused, openai.InternalServerError, 503, "no_eligible_worker", held=True
        )
        assert len(front.sent) == 1
        await front.assert_cancelled(error["metadata"]["request_id"])
        # The listed worker comes online for chat: nothing is left for it.
        await pop_nothing(listed)


async def test_fail_fast_without_an_eligible_worker_is_a_503_queue_unavailable_with_retry_after_and_cancels() -> (
    None
):
    async with open_front() as front:
        listed, horde = await outside_worker_list(front)
        client = await front.sdk()
        refused = await refusal(
            client, extra_body={"horde": {**horde, "availability_mode": "fail_fast"}}
        )
        error = assert_error(
            refused, openai.InternalServerError, 503, "queue_unavailable", held=True
        )
        retry_after = refused.response.headers.get("Retry-After")
        assert retry_after is not None
        assert int(retry_after) >= 1
        assert len(front.sent) == 1
        await front.assert_cancelled(error["metadata"]["request_id"])
        await pop_nothing(listed)


async def test_fail_fast_when_every_eligible_thread_is_busy_is_a_503_queue_unavailable_and_cancels() -> (
    None
):
    # The chat guide, "Admission against the online pool": threads busy with other jobs
    # are not free eligible threads. The estimated wait (8 tokens at the
    # assumed speed) is well within the budget, which bounds the call should
    # it wait instead.
    async with open_front(front={"timeout": 15.0}) as front:
        worker = await front.worker("w1")  # one thread
        assert (await front.env.submit(chat_body())).status_code == 202
        await pop_job(worker)  # its only thread is busy with that job
        client = await front.sdk()
        refused = await refusal(
            client, max_tokens=8, extra_body={"horde": {"availability_mode": "fail_fast"}}
        )
        error = assert_error(
            refused, openai.InternalServerError, 503, "queue_unavailable", held=True
        )
        assert int(refused.response.headers["Retry-After"]) >= 1
        await front.assert_cancelled(error["metadata"]["request_id"])


async def test_the_x_horde_options_header_carries_the_horde_object_of_a_client_without_body_fields() -> (
    None
):
    # As the test above, with fail_fast sent the way a coding agent can
    # send it: in a header, its body untouched.
    async with open_front(front={"timeout": 15.0}) as front:
        worker = await front.worker("w1")  # one thread
        assert (await front.env.submit(chat_body())).status_code == 202
        await pop_job(worker)  # its only thread is busy with that job
        client = await front.sdk()
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=MODEL,
                messages=[user("Name one colour.")],
                max_tokens=8,
                extra_headers={"X-Horde-Options": '{"availability_mode": "fail_fast"}'},
            )
        error = assert_error(
            caught.value, openai.InternalServerError, 503, "queue_unavailable", held=True
        )
        await front.assert_cancelled(error["metadata"]["request_id"])


async def test_an_x_horde_options_header_that_is_not_a_json_object_is_a_400_naming_it() -> None:
    async with open_front() as front:
        client = await front.sdk()
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=MODEL,
                messages=[user("Name one colour.")],
                max_tokens=8,
                extra_headers={"X-Horde-Options": "fail_fast"},
            )
        assert_error(
            caught.value,
            openai.BadRequestError,
            400,
            "BadRequest",
            held=False,
            param="X-Horde-Options",
        )
        assert len(front.sent) == 1  # not retried
        async with httpx.AsyncClient(base_url=front.env.horde.url) as client:
            load = (await client.get("/api/v2/status/performance")).json()
        assert load["queued_requests"] == 0  # nothing queued


async def test_fail_fast_with_an_idle_eligible_worker_is_answered() -> None:
    async with open_served_front() as (_, worker, client):
        completion = await answered(
            client, worker.serve_one, extra_body={"horde": {"availability_mode": "fail_fast"}}
        )
        assert completion.choices[0].message.content == "reply to: Name one colour."


# Validation before submission ------------------------------------------------------------


async def test_an_unsupported_parameter_is_refused_400_naming_it_before_anything_is_queued() -> (
    None
):
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk()
        refused = await refusal(client, extra_body={"top_k": 5})
        error = assert_error(
            refused,
            openai.BadRequestError,
            400,
            "UnsupportedChatParameter",
            held=False,
            param="top_k",
            kind="invalid_request_error",
        )
        assert "top_k" in error["message"]
        # A validation error comes before submission: no retry header at all.
        assert "x-should-retry" not in refused.response.headers
        assert await front.queued() == 0


async def test_a_model_id_with_a_colon_is_refused_404_model_not_found() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk()
        refused = await refusal(client, model="chat-model:free")
        error = assert_error(
            refused, openai.NotFoundError, 404, "model_not_found", held=False, param="model"
        )
        assert "chat-model:free" in error["message"]
        assert await front.queued() == 0


async def test_a_model_no_online_chat_worker_serves_is_refused_503_no_eligible_worker() -> None:
    # Known to the horde or not: only the colon rule is 404 (chat guide, "Worker availability").
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk()
        refused = await refusal(client, model="never-served-model")
        error = assert_error(
            refused,
            openai.InternalServerError,
            503,
            "no_eligible_worker",
            held=False,
            param="model",
            kind="service_unavailable",
        )
        assert "never-served-model" in error["message"]
        assert await front.queued() == 0


# Keys --------------------------------------------------------------------------------------


async def test_a_call_without_authorization_uses_the_anonymous_key() -> None:
    async with open_front() as front:
        worker = await front.worker("w1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve_one)
            # The SDK always sends a bearer key: a plain client sends none.
            response = await front.http.post(
                CHAT, json={"model": MODEL, "messages": [user("Name one colour.")]}
            )
        assert response.status_code == 200, response.text
        completion = response.json()
        assert completion["object"] == "chat.completion"
        assert completion["choices"][0]["message"]["content"] == "reply to: Name one colour."


async def test_a_call_without_authorization_is_refused_401_when_anonymous_use_is_off() -> None:
    async with open_front(allow_anonymous=False) as front:
        await front.worker("w1")
        response = await front.http.post(
            CHAT, json={"model": MODEL, "messages": [user("Name one colour.")]}
        )
        assert response.status_code == 401, response.text
        assert set(response.json()["error"]) == ENVELOPE_KEYS
        assert await front.queued() == 0


async def test_a_bad_bearer_key_is_refused_401() -> None:
    async with open_front() as front:
        await front.worker("w1")
        client = await front.sdk(api_key="not-a-key-of-this-horde")
        refused = await refusal(client)
        assert_error(
            refused,
            openai.AuthenticationError,
            401,
            "InvalidAPIKey",
            held=False,
            kind="authentication_error",
        )
        assert await front.queued() == 0


async def test_an_authorization_header_that_is_not_bearer_is_refused_401() -> None:
    async with open_front() as front:
        await front.worker("w1")
        response = await front.http.post(
            CHAT,
            headers={"Authorization": f"Basic {front.env.requester}"},
            json={"model": MODEL, "messages": [user("Name one colour.")]},
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "InvalidAPIKey"
        assert await front.queued() == 0


# Leaving the wait ----------------------------------------------------------------------------


async def test_a_client_that_disconnects_mid_wait_gets_its_request_cancelled_and_not_charged() -> (
    None
):
    async with open_front() as front:
        worker = await front.worker("w1")
        kudos = await front.env.kudos()
        async with httpx.AsyncClient(base_url=front.url, verify=TLS) as leaving:

            async def call(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                task_status.started()
                await leaving.post(
                    CHAT,
                    headers=front.bearer,
                    json={"model": MODEL, "messages": [user("Name one colour.")]},
                )

            await front.leave_once_queued(call)
        await pop_nothing(worker)
        assert await front.env.kudos() == kudos


async def test_a_call_past_the_fronts_deadline_is_a_408_and_cancels_the_request() -> None:
    async with open_front({"timeout": 0.5, "recheck_interval": 0.2}) as front:
        worker = await front.worker("w1")  # online and eligible, never pops again
        client = await front.sdk()
        refused = await refusal(client)
        # 408 has no SDK class of its own; without x-should-retry the SDK
        # would retry it.
        error = assert_error(refused, openai.APIStatusError, 408, "RequestTimeout", held=True)
        assert len(front.sent) == 1
        await front.assert_cancelled(error["metadata"]["request_id"])
        await pop_nothing(worker)


@pytest.mark.parametrize("outcome", ["faulted_502", "no_eligible_worker_503"])
async def test_after_submission_the_sdk_with_default_retries_sends_one_request_even_on_a_5xx(
    outcome: str,
) -> None:
    async with open_front({"no_worker_grace": 0.5, "recheck_interval": 0.2}) as front:
        client = await front.sdk(max_retries=SDK_DEFAULT_RETRIES)
        body: dict[str, Any] = {"model": MODEL, "messages": [user("Name one colour.")]}
        async with anyio.create_task_group() as tg:
            if outcome == "faulted_502":
                worker = await front.worker("w1", SCHEMA_FEATURES)
                body["response_format"] = STRICT_SCHEMA
                tg.start_soon(refuse_until_the_request_faults, worker, text_reply("Blue."))
            else:
                _, horde = await outside_worker_list(front)
                body["extra_body"] = {"horde": horde}
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(**body)
        assert caught.value.status_code in (502, 503)
        assert caught.value.response.headers.get("x-should-retry") == "false"
        assert len(front.sent) == 1


# Models ----------------------------------------------------------------------------------------


async def test_models_lists_the_models_with_an_online_chat_worker_with_their_chat_summary() -> None:
    async with open_front() as front:
        a1_limits = {"max_context_length": 4096, "max_length": 512}
        a2_limits = {"max_context_length": 8192, "max_length": 256}
        await front.worker("a1", ("tools", *STRICT), model_id="alpha", limits=a1_limits)
        await front.worker("a2", ("json_schema", *STRICT), model_id="alpha", limits=a2_limits)
        await front.worker("g1", STRICT, model_id="gamma", limits=a1_limits)
        beta = await front.env.text_worker("b1", models=["beta"])  # no chat declaration
        await pop_nothing(beta)
        client = await front.sdk()
        page = await client.models.list()
        listed = {m.id: m for m in page.data}
        assert set(listed) == {"alpha", "gamma"}
        assert all(m.object == "model" for m in page.data)
        assert listed["alpha"].model_extra["chat"] == {  # type: ignore[index]
            "workers": 2,
            "max_context_length": max(
                a1_limits["max_context_length"], a2_limits["max_context_length"]
            ),
            "max_length": max(a1_limits["max_length"], a2_limits["max_length"]),
            "features": sorted({"tools", "json_schema", *STRICT}),
        }
        assert listed["gamma"].model_extra["chat"] == {  # type: ignore[index]
            "workers": 1,
            **a1_limits,
            "features": sorted(STRICT),
        }
        raw = await front.http.get("/v1/models")
        assert raw.json()["object"] == "list"

        one = await client.models.retrieve("alpha")
        assert one.id == "alpha"
        assert one.model_extra["chat"] == listed["alpha"].model_extra["chat"]  # type: ignore[index]
        with pytest.raises(openai.APIStatusError) as caught:
            await client.models.retrieve("beta")
        assert_error(
            caught.value, openai.NotFoundError, 404, "model_not_found", held=False, param="model"
        )


# Admission -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", ["max_open_per_source", "max_open_calls"])
async def test_a_call_over_the_fronts_open_call_cap_is_refused_503_front_at_capacity(
    cap: str,
) -> None:
    async with open_front({cap: 1}) as front:
        worker = await front.worker("w1")
        client = await front.sdk(max_retries=0)
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def held_open() -> None:
                answers.append(await client.chat.completions.create(**chat_request("First.")))

            tg.start_soon(held_open)
            await front.until_queued(1)
            refused = await refusal(client, content="Second.")
            # Refused before it was read or queued: a retry is harmless.
            assert_error(refused, openai.InternalServerError, 503, "FrontAtCapacity", held=False)
            assert await front.queued() == 1
            await worker.serve_one()
        assert answers[0].choices[0].message.content == "reply to: First."
