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
from typing import Any, Protocol

import anyio

from hordelite.config import FrontConfig
from hordelite.contract.chat_request import ChatRequest, flatten_messages, parse_chat_request
from hordelite.contract.completion_request import Context, parse_completion_request
from hordelite.contract.horde_header import HORDE_OPTIONS_HEADER, header_options, with_options
from hordelite.contract.limits import ANONYMOUS_API_KEY, MAX_API_KEY_CHARS
from hordelite.contract.progress import streams_progress
from hordelite.errors import RC, HordeError
from hordelite.front import _shape
from hordelite.front._call import TICK, Call
from hordelite.front._encoder import KEEPALIVE, ChatChunks, from_reply
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
    horde: Horde,
    exc: HordeError,
    envelope: CallEnvelope = envelopes.openai,
    *,
    held: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Answer:
    """A refusal the call answers itself, in its route's envelope, counted."""
    horde.metrics.refusals.labels(exc.rc.name).inc()
    return envelope(exc, held=held, metadata=metadata)


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

    def __init__(self, body: Any, horde: Horde, options: dict[str, Any]) -> None:
        self._take(horde, parse_chat_request(with_options(body, options)))

    def _take(self, horde: Horde, req: ChatRequest) -> None:
        """The call of ``req`` (a route that translates its body into a chat
        request starts here)."""
        self.horde = horde
        _check_models(req.models)
        # The request, until it is queued; a stream's relay reads it after.
        self.req: ChatRequest | None = req
        self.stream = req.stream
        self.fail_fast = req.horde.availability_mode == "fail_fast"
        self.include_reasoning = req.horde.include_reasoning
        self.prompt_chars = len(flatten_messages(req.messages, req.tools))
        self._encoder: ChatChunks | None = None  # a stream's, once it starts

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
        include_reasoning = req.horde.include_reasoning
        encoder = self._encoder = ChatChunks(
            call.request_id, req.models[0], self.prompt_chars, req.include_usage
        )
        if streams_progress(req):
            return relay(
                call, encoder, include_reasoning, config.pace_progress, config.keepalive_interval
            )
        return _finished(
            call,
            config.keepalive_interval,
            encoder.keepalive(),
            lambda status: from_reply(encoder, status, include_reasoning),
        )

    def failure(self, call: Call, exc: HordeError) -> Iterator[bytes]:
        assert self._encoder is not None  # a stream's events come first
        return self._encoder.failure(exc)


class CompletionPlan:
    """``POST /v1/completions``: OpenAI's legacy completion as a native text
    request (decision 0057), answered when its text is done."""

    def __init__(self, body: Any, horde: Horde, options: dict[str, Any]) -> None:
        self.horde = horde
        self.req = req = parse_completion_request(with_options(body, options))
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
        return _finished(call, config.keepalive_interval, KEEPALIVE, self._shape(call).chunks)

    def failure(self, call: Call, exc: HordeError) -> Iterator[bytes]:
        yield _shape.sse(envelopes.openai_error(exc, {"request_id": call.request_id}))
        yield _shape.DONE


def _check_models(models: Sequence[str]) -> None:
    for model in models:
        # The front reserves the colon (e.g. for provider suffixes).
        if ":" in model:
            raise HordeError(
                RC.model_not_found,
                f"The model {model!r} does not exist on this front.",
                param="model",
            )


class CallPlan(Protocol):
    """What a route's call makes of its body: the native request it queues,
    and its answer, stream and stream failure in the route's API."""

    stream: bool

    async def queue(self, submitter: Submitter) -> str: ...

    def call(self, request_id: str, started: float, config: FrontConfig) -> Call: ...

    def answer(self, call: Call, status: RequestStatus) -> dict[str, Any]: ...

    def events(self, call: Call, config: FrontConfig) -> AsyncIterator[bytes]: ...

    def failure(self, call: Call, exc: HordeError) -> Iterator[bytes]: ...


# A route's plan from its body, the horde and the X-Horde-Options header's options.
Plan = Callable[[Any, Horde, dict[str, Any]], CallPlan]


class CallEnvelope(Protocol):
    """A call's refusal in its route's envelope (``held``: the horde may
    hold the request, so the client must not retry on its own)."""

    def __call__(
        self, exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
    ) -> Answer: ...


@dataclasses.dataclass(frozen=True)
class Caller:
    """What a call needs of its HTTP request."""

    body: Callable[[], Awaitable[Any]]  # the checked JSON body (a HordeError when not)
    api_key: Callable[[], str]  # the horde key its headers carry (a HordeError when malformed)
    agent: str  # the client agent
    # The client's address (contract.forwarded.client_address: through a
    # trusted proxy, the address it forwarded), which an anonymous request's
    # budgets and the per-source cap count; None when it has none.
    client: str | None
    options: str | None  # the X-Horde-Options header (contract.horde_header)

    @property
    def source(self) -> str:
        """The per-source cap's key."""
        return self.client or "unknown"

    def submitter(self, horde: Horde) -> Submitter:
        """Who queues the call's request. No operation key: the service is
        called in-process, so no answer can be lost on the way back, and
        there is nothing to recover. The call is the request's only reader,
        held by this process (decision 0051): if the process dies, the
        request is cancelled."""
        return Submitter(self.api_key(), self.agent, client=self.client, reader=horde.readers.name)


async def serve(
    horde: Horde,
    admission: Admission,
    plan_of: Plan,
    caller: Caller,
    envelope: CallEnvelope = envelopes.openai,
) -> Answer:
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
        plan = plan_of(await caller.body(), horde, header_options(caller.options))
        timer.stream = plan.stream
        started = anyio.current_time()
        submitter = caller.submitter(horde)
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
                events = plan.events(call, config)
                return _stream(horde, call, events, lambda exc: plan.failure(call, exc), release)
            async for final in call.wait():
                status = final
            return json_answer(plan.answer(call, status))
        except Exception as exc:
            await call.cancel()
            return error_answer(
                horde,
                _as_horde_error(exc),
                envelope,
                held=True,
                metadata={"request_id": call.request_id},
            )
        finally:
            if not handed_over:
                await call.cancel()
    except HordeError as exc:
        return error_answer(horde, exc, envelope)
    finally:
        if not handed_over:
            release()


async def _finished(
    call: Call,
    every: float,
    keepalive: bytes,
    chunks: Callable[[RequestStatus], Iterator[bytes]],
) -> AsyncIterator[bytes]:
    """A stream served from the finished reply: ``keepalive`` every
    ``every`` seconds while it waits, then the reply's chunks."""
    async for item in call.wait(every):
        if item is TICK:
            yield keepalive
        else:
            for chunk in chunks(item):
                yield chunk


def _stream(
    horde: Horde,
    call: Call,
    source: AsyncIterator[bytes],
    failure: Callable[[HordeError], Iterator[bytes]],
    release: Callable[[], None],
) -> Answer:
    """The SSE answer; its headers go out now, so later errors are events
    (``failure``'s, in the call's API)."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for piece in source:
                yield piece
        except Exception as exc:
            await call.cancel()
            for piece in failure(_as_horde_error(exc)):
                yield piece
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

    async def _call(
        self,
        request: Request,
        plan: Plan,
        api_key: Callable[[], str] | None = None,
        envelope: CallEnvelope = envelopes.openai,
    ) -> Answer:
        """A call, cancelled when its client leaves; its key from
        ``api_key`` (by default an ``Authorization: Bearer`` header), its
        refusals in ``envelope`` (OpenAI's by default).

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
            body,
            api_key or (lambda: bearer_key(request.header("authorization"))),
            request.client_agent(),
            request.client_address(),
            request.header(HORDE_OPTIONS_HEADER),
        )
        return await request.unless_gone(
            lambda: serve(self.horde, self.admission, plan, caller, envelope)
        )

    async def models(self, request: Request) -> Answer:
        return json_answer({"object": "list", "data": await self.chat_models()})

    async def model(self, request: Request) -> Answer:
        model = request.params["model"]
        for entry in await self.chat_models():
            if entry["id"] == model:
                return json_answer(entry)
        raise HordeError(
            RC.model_not_found, f"The model {model!r} does not exist on this front.", param="model"
        )

    async def chat_models(self) -> list[dict[str, Any]]:
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
