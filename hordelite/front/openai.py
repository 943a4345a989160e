"""The OpenAI-compatible routes: /v1/chat/completions, /v1/completions and /v1/models.

A call moves through the states of the specification's front diagram:
admitted (per-source and global caps), validated (the chat contract the
native route uses), submitted (in-process: no answer can be lost on the way back, so no
operation key), the first
status read, the wait, then an answer, a fault, or a cancellation of the horde
request. Every error once the horde may hold the request says
``x-should-retry: false``, so SDKs do not create a second charged request.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio

from hordelite.config import FrontConfig
from hordelite.contract.chat_request import ChatRequest, flatten_messages, parse_chat_request
from hordelite.contract.completion_request import Context, parse_completion_request
from hordelite.contract.limits import ANONYMOUS_API_KEY, MAX_API_KEY_CHARS
from hordelite.contract.progress import streams_progress
from hordelite.errors import RC, HordeError
from hordelite.front import _shape
from hordelite.front._call import TICK, Call
from hordelite.front._relay import relay
from hordelite.horde.requests import Submitter
from hordelite.horde.results import RequestStatus
from hordelite.horde.service import Horde
from hordelite.http import envelopes
from hordelite.http.answer import Answer, json_answer
from hordelite.http.loop import run_to_completion
from hordelite.http.request import Request

log = logging.getLogger("hordelite.front")


class Admission:
    """Open calls, in all and per client address."""

    def __init__(self, config: FrontConfig) -> None:
        self.config = config
        self.open = 0
        self.by_source: collections.Counter[str] = collections.Counter()
        # Set once no call is open, for a stop waiting on that (none_open).
        self._none_open: anyio.Event | None = None

    def admit(self, source: str) -> Callable[[], None]:
        """Count a call in; returns its release. 503 FrontAtCapacity when full."""
        if self.open >= self.config.max_open_calls:
            raise HordeError(RC.FrontAtCapacity)
        if self.by_source[source] >= self.config.max_open_per_source:
            raise HordeError(
                RC.FrontAtCapacity,
                "This address holds as many open calls as it may; try again shortly.",
            )
        self.open += 1
        self.by_source[source] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1
                self.by_source[source] -= 1
                if not self.by_source[source]:
                    del self.by_source[source]
                if not self.open and self._none_open is not None:
                    self._none_open.set()
                    self._none_open = None

        return release

    async def none_open(self) -> None:
        """Return once no call is open (at once when none is)."""
        while self.open:
            if self._none_open is None:
                self._none_open = anyio.Event()
            await self._none_open.wait()


def _as_horde_error(exc: Exception) -> HordeError:
    """Any failure once the horde may hold the request, as a refusal: the
    caller answers it with x-should-retry: false (a retry would be a second
    charged request)."""
    return envelopes.as_refusal(exc, "an OpenAI call")


def error_answer(
    horde: Horde, exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Answer:
    """A refusal the call answers itself, in OpenAI's envelope, counted."""
    horde.metrics.refusals.labels(exc.rc.name).inc()
    return envelopes.openai(exc, held=held, metadata=metadata)


def bearer_key(header: str | None) -> str:
    """The key of an ``Authorization: Bearer`` header; none is the anonymous key."""
    if header is None:
        return ANONYMOUS_API_KEY
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or len(key) > MAX_API_KEY_CHARS:
        raise HordeError(RC.InvalidAPIKey, "The Authorization header must be 'Bearer <API key>'.")
    return key


class ChatPlan:
    """``POST /v1/chat/completions``: a native chat request."""

    def __init__(self, body: Any, horde: Horde) -> None:
        self.horde = horde
        req = parse_chat_request(body)
        _check_models(req.models)
        # The request, until it is queued; a stream's relay reads it after.
        self.req: ChatRequest | None = req
        self.stream = req.stream
        self.fail_fast = req.horde.availability_mode == "fail_fast"
        self.include_reasoning = req.horde.include_reasoning
        self.prompt_chars = len(flatten_messages(req.messages, req.tools))

    async def queue(self, submitter: Submitter) -> str:
        assert self.req is not None
        answer = await self.horde.requests.queue_chat(submitter, self.req)
        if not self.stream:
            # Stored: a call held for minutes need not keep the request
            # (its messages, as decoded) for its answer.
            self.req = None
        return answer.id

    def call(self, request_id: str, started: float, config: FrontConfig) -> Call:
        return Call(self.horde, config, request_id, started, fail_fast=self.fail_fast)

    def answer(self, call: Call, status: RequestStatus) -> dict[str, Any]:
        return _shape.completion(call.request_id, status, self.prompt_chars, self.include_reasoning)

    def events(self, call: Call, config: FrontConfig) -> AsyncIterator[bytes]:
        req = self.req
        assert req is not None  # kept for a stream
        if streams_progress(req):
            return relay(
                call, req, self.prompt_chars, config.pace_progress, config.keepalive_interval
            )
        return _finished(
            call,
            config.keepalive_interval,
            lambda status: _shape.chunks(
                call.request_id,
                status,
                self.prompt_chars,
                req.horde.include_reasoning,
                req.include_usage,
            ),
        )


class CompletionPlan:
    """``POST /v1/completions``: OpenAI's legacy completion as a native text
    request (decision 0057), answered when its text is done."""

    def __init__(self, body: Any, horde: Horde) -> None:
        self.horde = horde
        self.req = req = parse_completion_request(body)
        _check_models(req.text.models)
        self.stream = req.stream
        self.fail_fast = req.fail_fast
        self.context: Context | None = None

    async def queue(self, submitter: Submitter) -> str:
        answer, self.context = await self.horde.requests.queue_completion(submitter, self.req)
        return answer.id

    def call(self, request_id: str, started: float, config: FrontConfig) -> Call:
        return Call(self.horde, config, request_id, started, kind="text", fail_fast=self.fail_fast)

    def _shape(self, call: Call) -> _shape.TextCompletion:
        assert self.context is not None  # set when it was queued
        return _shape.TextCompletion(call.request_id, self.req, self.context)

    def answer(self, call: Call, status: RequestStatus) -> dict[str, Any]:
        return self._shape(call).completion(status)

    def events(self, call: Call, config: FrontConfig) -> AsyncIterator[bytes]:
        return _finished(call, config.keepalive_interval, self._shape(call).chunks)


def _check_models(models: Sequence[str]) -> None:
    for model in models:
        # The front reserves the colon (e.g. for provider suffixes).
        if ":" in model:
            raise HordeError(
                RC.model_not_found,
                f"The model {model!r} does not exist on this front.",
                param="model",
            )


Plan = type[ChatPlan] | type[CompletionPlan]


@dataclasses.dataclass(frozen=True)
class Caller:
    """What a call needs of its HTTP request."""

    body: Callable[[], Awaitable[Any]]  # the checked JSON body (a HordeError when not)
    authorization: str | None  # the Authorization header
    agent: str  # the client agent
    # The client's address (contract.forwarded.client_address: through a
    # trusted proxy, the address it forwarded), which an anonymous request's
    # budgets and the per-source cap count; None when it has none.
    client: str | None

    @property
    def source(self) -> str:
        """The per-source cap's key."""
        return self.client or "unknown"


async def serve(horde: Horde, admission: Admission, plan_of: Plan, caller: Caller) -> Answer:
    """One call through the front's states (see the module): admitted,
    validated, queued, the first read, the wait, the answer; every exit but
    an answer or a fault cancels the request."""
    admitted = admission.admit(caller.source)
    timer = horde.metrics.front_call()

    def release() -> None:  # at the answer's end, once (a stream's included)
        admitted()
        timer.done()

    handed_over = False
    try:
        plan = plan_of(await caller.body(), horde)
        timer.stream = plan.stream
        started = anyio.current_time()
        # No operation key: the service is called in-process, so no answer
        # can be lost on the way back, and there is nothing to recover. The
        # call is the request's only reader, held by this process (decision
        # 0051): if the process dies, the request is cancelled.
        submitter = Submitter(
            bearer_key(caller.authorization),
            caller.agent,
            client=caller.client,
            reader=horde.readers.name,
        )
        config = horde.config.front
        # Run to its end even when the client leaves meanwhile (the handler
        # is cancelled then): the request it queued is cancelled below.
        request_id = await run_to_completion(lambda: plan.queue(submitter))
        call = plan.call(request_id, started, config)
        try:
            status = await call.first_read()
            if plan.stream:
                handed_over = True
                timer.streaming()
                return _stream(horde, call, plan.events(call, config), release)
            async for final in call.wait():
                status = final
            return json_answer(plan.answer(call, status))
        except Exception as exc:
            await call.cancel()
            return error_answer(
                horde,
                _as_horde_error(exc),
                held=True,
                metadata={"request_id": call.request_id},
            )
        finally:
            if not handed_over:
                await call.cancel()
    except HordeError as exc:
        return error_answer(horde, exc)
    finally:
        if not handed_over:
            release()


async def _finished(
    call: Call, keepalive: float, chunks: Callable[[RequestStatus], Iterator[bytes]]
) -> AsyncIterator[bytes]:
    """A stream served from the finished reply: a comment every
    ``keepalive`` seconds while it waits, then the reply's chunks."""
    async for item in call.wait(keepalive):
        if item is TICK:
            yield b": waiting for a worker\n\n"
        else:
            for chunk in chunks(item):
                yield chunk


def _stream(
    horde: Horde, call: Call, source: AsyncIterator[bytes], release: Callable[[], None]
) -> Answer:
    """The SSE answer; its headers go out now, so later errors are events."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for piece in source:
                yield piece
        except Exception as exc:
            await call.cancel()
            yield _shape.sse(
                envelopes.openai_error(_as_horde_error(exc), {"request_id": call.request_id})
            )
            yield _shape.DONE
        finally:
            await finish()

    async def finish() -> None:
        await call.cancel()
        release()

    headers = [
        ("content-type", "text/event-stream"),
        ("Cache-Control", "no-cache"),
        ("x-should-retry", "false"),
    ]
    return Answer(200, headers, events=events(), finish=finish)


class OpenAIRoutes:
    """The front's routes (/v1), each from a ``Request`` to an ``Answer``;
    refusals in OpenAI's envelope."""

    def __init__(self, horde: Horde) -> None:
        self.horde = horde
        self.admission = Admission(horde.config.front)

    async def chat_completions(self, request: Request) -> Answer:
        return await self._call(request, ChatPlan)

    async def completions(self, request: Request) -> Answer:
        return await self._call(request, CompletionPlan)

    async def _call(self, request: Request, plan: Plan) -> Answer:
        """An OpenAI call, cancelled when its client leaves.

        The body is read first, so that the connection can be watched for
        the whole call; a body that cannot be read is refused when ``serve``
        asks for it, after admission."""
        read: list[Any] = []  # the document, until serve takes it (not held for the call)
        failure: HordeError | None = None
        try:
            read.append(await request.json())
        except HordeError as exc:  # 400 (not JSON), 408, 413
            failure = exc

        async def body() -> Any:
            if failure is not None:
                raise failure
            return read.pop()

        caller = Caller(
            body, request.header("authorization"), request.client_agent(), request.client_address()
        )
        return await request.unless_gone(lambda: serve(self.horde, self.admission, plan, caller))

    async def models(self, request: Request) -> Answer:
        return json_answer({"object": "list", "data": await self._chat_models()})

    async def model(self, request: Request) -> Answer:
        model = request.params["model"]
        for entry in await self._chat_models():
            if entry["id"] == model:
                return json_answer(entry)
        raise HordeError(
            RC.model_not_found, f"The model {model!r} does not exist on this front.", param="model"
        )

    async def _chat_models(self) -> list[dict[str, Any]]:
        """Models with an online chat worker, in OpenAI's shape, each with
        its chat declaration summary (ids with a colon cannot be reached here)."""
        return [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "hordelite",
                "chat": summary,
            }
            for name, summary in (await self.horde.directory.chat_summary()).items()
            if ":" not in name
        ]
