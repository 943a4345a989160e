"""OpenAI's Responses API: ``POST /v1/responses`` as a native chat request
(decision 0078), and the stored Responses (decision 0078):
``GET``/``DELETE /v1/responses/{id}`` and ``previous_response_id``.

A call runs through the chat route's ``serve`` (admission, queueing, the
first read, the wait or the stream, cancellation when the client leaves, no
charge for an unread reply) with a ``ResponsesPlan``: the translated chat
request, answered as a Response and streamed as the Responses events.

A stored Response keeps a record with its request (the horde's
``stored_response``): its echo, its conversation without its
instructions, and what its answer is built from. ``GET`` builds the
Response again from it and the request's status, for as long as the horde
keeps the request; ``previous_response_id`` puts its conversation and its
reply before the new input.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from hordelite.config import FrontConfig
from hordelite.contract.chat_request import ChatRequest, flatten_messages
from hordelite.contract.horde_header import with_options
from hordelite.contract.progress import streams_progress
from hordelite.contract.responses_request import (
    ResponsesCall,
    ResponsesEcho,
    parse_responses_request,
    request_id_of,
    response_id,
)
from hordelite.errors import RC, HordeError
from hordelite.front import _shape
from hordelite.front._call import TICK, Call
from hordelite.front._encoder import from_reply
from hordelite.front._relay import relay
from hordelite.front._responses import (
    ResponseContext,
    ResponsesEncoder,
    ended_response,
    response,
)
from hordelite.front.openai import OpenAIRoutes, _check_models, bearer_key
from hordelite.horde.requests import Submitter
from hordelite.horde.results import RequestStatus
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request

# A held call's context stands without its echo until the answer decodes it.
_NO_ECHO = ResponsesEcho(fields={})


class ResponsesPlan:
    """``POST /v1/responses``: the chat request of a Responses body (with
    the X-Horde-Options header's options, as on the chat route), answered
    as a Response. The chat request is built when it is queued: a
    ``previous_response_id``'s conversation is read then."""

    def __init__(self, body: Any, horde: Horde, options: dict[str, Any]) -> None:
        self.horde = horde
        # The checked body, until it is queued: a call held for minutes keeps
        # only what its answer needs (the echo, in its context).
        self.responses: ResponsesCall | None = parse_responses_request(with_options(body, options))
        self.stream = self.responses.stream
        self.fail_fast = False
        self.include_reasoning = True
        # The request, until it is queued; a stream's encoder reads it after.
        self.req: ChatRequest | None = None
        self.context: ResponseContext | None = None  # set once queued
        self._echo_text = ""  # a whole answer's echo, once queued
        self._encoder: ResponsesEncoder | None = None  # a stream's, once it starts

    async def queue(self, submitter: Submitter) -> str:
        responses = self.responses
        assert responses is not None  # queued once
        history = await self._history(responses, submitter)
        req = responses.chat_request(history)
        _check_models(req.models)
        self.fail_fast = req.horde.availability_mode == "fail_fast"
        self.include_reasoning = req.horde.include_reasoning
        prompt_chars = len(flatten_messages(req.messages, req.tools))
        created_at = int(time.time())
        record = None
        if responses.store:
            record = {
                "echo": responses.echo.to_json(),
                "conversation": _conversation(responses, history),
                "include_reasoning": self.include_reasoning,
                "prompt_chars": prompt_chars,
                "created_at": created_at,
                "model": req.models[0],
            }
        answer = await self.horde.requests.queue_chat(submitter, req, record)
        self.req = req if self.stream else None
        self.context = ResponseContext(responses.echo, answer.id, prompt_chars, created_at)
        if not self.stream:
            # Held for minutes: the echo as its JSON text, a quarter of its
            # decoded size (a text.format schema is a tree of dicts).
            self._echo_text = json.dumps(responses.echo.to_json(), separators=(",", ":"))
            self.context = dataclasses.replace(self.context, echo=_NO_ECHO)
        self.responses = None
        return answer.id

    async def _history(
        self, responses: ResponsesCall, submitter: Submitter
    ) -> list[dict[str, Any]]:
        """The conversation ``previous_response_id`` names: its messages
        (without its instructions) and its reply. Refused by name when no
        stored Response of the caller has that id, or it has no reply."""
        previous = responses.previous_response_id
        if previous is None:
            return []
        request_id = request_id_of(previous)
        record = None
        if request_id is not None:
            record = await self.horde.requests.stored_response(
                submitter.api_key, submitter.client, request_id
            )
        if request_id is None or record is None:
            raise HordeError(
                RC.previous_response_not_found,
                f"Previous response with id {previous[:80]!r} not found.",
                param="previous_response_id",
            )
        status = await self.horde.requests.status("chat", request_id, with_position=False)
        if not status.done or not status.generations:
            raise HordeError(
                RC.ChatRequestInvalid,
                f"Previous response with id {previous[:80]!r} has no reply to continue from: "
                "it is still in progress, failed or was cancelled.",
                param="previous_response_id",
            )
        _, reply = _shape.reply_of(status)
        said: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
        if reply.tool_calls:
            said["tool_calls"] = [
                {"id": call["id"], "type": "function", "function": call["function"]}
                for call in reply.tool_calls
            ]
        return [*record["conversation"], said]

    def call(self, request_id: str, started: float, config: FrontConfig) -> Call:
        return Call(self.horde, config, request_id, started, fail_fast=self.fail_fast)

    def answer(self, call: Call, status: RequestStatus) -> dict[str, Any]:
        assert self.context is not None  # set when it was queued
        echo = ResponsesEcho.from_json(json.loads(self._echo_text))
        context = dataclasses.replace(self.context, echo=echo)
        return response(context, status, self.include_reasoning)

    def events(self, call: Call, config: FrontConfig) -> AsyncIterator[bytes]:
        req, context = self.req, self.context
        assert req is not None  # kept for a stream
        assert context is not None
        encoder = self._encoder = ResponsesEncoder(context, req.models[0])
        if streams_progress(req):
            return relay(
                call,
                encoder,
                self.include_reasoning,
                config.pace_progress,
                config.keepalive_interval,
            )
        return _finished(call, config.keepalive_interval, encoder, self.include_reasoning)

    def failure(self, call: Call, exc: HordeError) -> Iterator[bytes]:
        assert self._encoder is not None  # a stream's events come first
        return self._encoder.failure(exc)


def _conversation(responses: ResponsesCall, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The call's chat messages without its instructions: what a call
    continuing it by previous_response_id puts before its own input
    (OpenAI carries no instructions over)."""
    messages = responses.chat_body["messages"]
    return [*history, *messages[1 if responses.has_instructions else 0 :]]


async def _finished(
    call: Call, every: float, encoder: ResponsesEncoder, include_reasoning: bool
) -> AsyncIterator[bytes]:
    """A stream served from the finished reply: its opening at once (the
    Response is created before the wait, as OpenAI's is), a
    response.in_progress every ``every`` seconds while it waits, then the
    reply's events."""
    for piece in encoder.opening():
        yield piece
    async for item in call.wait(every):
        if item is TICK:
            yield encoder.keepalive()
        else:
            for piece in from_reply(encoder, item, include_reasoning, opened=True):
                yield piece


def stored(record: dict[str, Any], request_id: str, status: RequestStatus) -> dict[str, Any]:
    """A stored Response read back: as answered when its request is done,
    else with no output (``failed``, ``cancelled`` for one cancelled or
    expired without a reply, or still ``queued`` or ``in_progress``)."""
    echo = ResponsesEcho.from_json(record["echo"])
    context = ResponseContext(echo, request_id, record["prompt_chars"], record["created_at"])
    model = record["model"]
    if status.faulted:
        fault = status.fault
        message = fault.message if fault else RC.ChatRequestFaulted.default_message
        return ended_response(context, model, "failed", HordeError(RC.ChatRequestFaulted, message))
    if status.done:
        if status.generations:
            return response(context, status, record["include_reasoning"])
        return ended_response(context, model, "cancelled")
    return ended_response(context, model, "in_progress" if status.processing else "queued")


class ResponsesRoutes:
    """``/v1/responses``: a call through the chat route's ``serve``, and
    the stored Responses of the key that made them (another key gets 404,
    as OpenAI answers)."""

    def __init__(self, front: OpenAIRoutes) -> None:
        self.front = front
        self.horde = front.horde

    async def create(self, request: Request) -> Answer:
        return await self.front._call(request, ResponsesPlan)

    async def retrieve(self, request: Request) -> Answer:
        request_id, record = await self._record(request)
        status = await self.horde.requests.status("chat", request_id, with_position=False)
        return json_answer(stored(record, request_id, status))

    async def delete(self, request: Request) -> Answer:
        request_id, _ = await self._record(request)
        api_key = bearer_key(request.header("authorization"))
        if not await self.horde.requests.delete_response(
            api_key, request.client_address(), request_id
        ):
            raise _not_found(request.params["response_id"])  # deleted meanwhile
        return json_answer(
            {"id": response_id(request_id), "object": "response.deleted", "deleted": True}
        )

    async def _record(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The request id and stored record the route's id names, for the
        caller's key; 404 response_not_found otherwise."""
        api_key = bearer_key(request.header("authorization"))
        value = request.params["response_id"]
        request_id = request_id_of(value)
        record = None
        if request_id is not None:
            record = await self.horde.requests.stored_response(
                api_key, request.client_address(), request_id
            )
        if request_id is None or record is None:
            raise _not_found(value)
        return request_id, record


def _not_found(value: str) -> HordeError:
    return HordeError(
        RC.response_not_found, f"Response with id {value[:80]!r} not found.", param="response_id"
    )
