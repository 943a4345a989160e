"""The OpenAI-compatible routes: /v1/chat/completions and /v1/models.

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
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from quart import Blueprint, Response, current_app, request

from hordelite._http import on_exchange_end, run_to_completion
from hordelite._request import client_agent, horde, json_body
from hordelite.config import FrontConfig
from hordelite.contract.chat_request import flatten_messages, parse_chat_request
from hordelite.contract.limits import ANONYMOUS_API_KEY, MAX_API_KEY_CHARS
from hordelite.contract.progress import streams_progress
from hordelite.errors import RC, HordeError, StorageUnavailable
from hordelite.front import _shape
from hordelite.front._call import TICK, Call
from hordelite.front._errors import envelope, error_response
from hordelite.front._relay import relay
from hordelite.horde.results import RequestStatus

front = Blueprint("front", __name__, url_prefix="/v1")
log = logging.getLogger("hordelite.front")


class Admission:
    """Open calls, in all and per client address."""

    def __init__(self, config: FrontConfig) -> None:
        self.config = config
        self.open = 0
        self.by_source: collections.Counter[str] = collections.Counter()

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

        return release


def _admission() -> Admission:
    return current_app.config["FRONT_ADMISSION"]  # type: ignore[no-any-return]


def _as_horde_error(exc: Exception) -> HordeError:
    """Any failure once the horde may hold the request, as a refusal: the
    caller answers it with x-should-retry: false (a retry would be a second
    charged request)."""
    if isinstance(exc, HordeError):
        return exc
    if isinstance(exc, StorageUnavailable):
        return HordeError(RC.StorageUnavailable)
    log.exception("unexpected error in an OpenAI call")
    return HordeError(RC.InternalServerError)


def bearer_key() -> str:
    """The key of ``Authorization: Bearer``; none is the anonymous key."""
    header = request.headers.get("Authorization")
    if header is None:
        return ANONYMOUS_API_KEY
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or len(key) > MAX_API_KEY_CHARS:
        raise HordeError(RC.InvalidAPIKey, "The Authorization header must be 'Bearer <API key>'.")
    return key


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


@front.post("/chat/completions")
async def chat_completions() -> Response:
    admitted = _admission().admit(request.remote_addr or "unknown")
    timer = horde().metrics.front_call()

    def release() -> None:  # at the answer's end, once (a stream's included)
        admitted()
        timer.done()

    handed_over = False
    try:
        req = parse_chat_request(await json_body())
        timer.stream = req.stream
        for model in req.models:
            # The front reserves the colon (e.g. for provider suffixes).
            if ":" in model:
                raise HordeError(
                    RC.model_not_found,
                    f"The model {model!r} does not exist on this front.",
                    param="model",
                )
        started = anyio.current_time()
        key, agent = bearer_key(), client_agent()
        # Run to its end even when the client leaves meanwhile (the handler
        # is cancelled then): the request it queued is cancelled below. No
        # operation key: the service is called in-process, so no answer can
        # be lost on the way back, and there is nothing to recover.
        # The call is the request's only reader, held by this process
        # (decision 0051): if the process dies, the request is cancelled.
        answer = await run_to_completion(
            lambda: horde().requests.queue_chat(key, req, agent, None, reader=horde().readers.name)
        )
        call = Call(horde(), current_app.config["HORDE"].config.front, answer.id, req, started)
        prompt_chars = len(flatten_messages(req.messages, req.tools))
        try:
            status = await call.first_read()
            if req.stream:
                handed_over = True
                timer.streaming()
                return _stream(call, status, prompt_chars, release)
            async for final in call.wait():
                status = final
            return _json(
                _shape.completion(
                    call.request_id, status, prompt_chars, req.horde.include_reasoning
                )
            )
        except Exception as exc:
            await call.cancel()
            return error_response(
                _as_horde_error(exc), held=True, metadata={"request_id": call.request_id}
            )
        finally:
            if not handed_over:
                await call.cancel()
    except HordeError as exc:
        return error_response(exc)
    finally:
        if not handed_over:
            release()


def _stream(
    call: Call, status: RequestStatus, prompt_chars: int, release: Callable[[], None]
) -> Response:
    """The SSE answer; its headers go out now, so later errors are events."""
    req = call.req
    config = current_app.config["HORDE"].config.front
    keepalive = config.keepalive_interval

    async def finished_reply() -> AsyncIterator[bytes]:
        async for item in call.wait(keepalive):
            if item is TICK:
                yield b": waiting for a worker\n\n"
            else:
                for chunk in _shape.chunks(
                    call.request_id,
                    item,
                    prompt_chars,
                    req.horde.include_reasoning,
                    req.include_usage,
                ):
                    yield chunk

    async def events() -> AsyncIterator[bytes]:
        try:
            if streams_progress(req):
                source = relay(call, prompt_chars, config.pace_progress, keepalive)
            else:
                source = finished_reply()
            async for piece in source:
                yield piece
        except Exception as exc:
            await call.cancel()
            yield _shape.sse(envelope(_as_horde_error(exc), {"request_id": call.request_id}))
            yield _shape.DONE
        finally:
            await finish()

    async def finish() -> None:
        await call.cancel()
        release()

    # Also when the client leaves before the body begins (events() then
    # never runs, nor its finally).
    on_exchange_end(request.scope, finish)
    response = Response(events(), status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["x-should-retry"] = "false"
    response.timeout = None  # the front's own deadline bounds the stream
    return response


@front.get("/models")
async def models() -> Response:
    return _json({"object": "list", "data": await _chat_models()})


@front.get("/models/<path:model>")
async def model(model: str) -> Response:
    for entry in await _chat_models():
        if entry["id"] == model:
            return _json(entry)
    return error_response(
        HordeError(
            RC.model_not_found, f"The model {model!r} does not exist on this front.", param="model"
        )
    )


async def _chat_models() -> list[dict[str, Any]]:
    """Models with an online chat worker, in OpenAI's shape, each with its
    chat declaration summary (ids with a colon cannot be reached here)."""
    return [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "hordelite",
            "chat": summary,
        }
        for name, summary in (await horde().directory.chat_summary()).items()
        if ":" not in name
    ]
