"""Anthropic's Messages API: ``POST /v1/messages``, ``POST
/v1/messages/count_tokens``, and ``GET /v1/models`` in Anthropic's shape
(decision 0079, docs/reference/messages_api.md).

A Messages call is the chat request ``/v1/chat/completions`` queues: its
body is translated (``contract.messages_request``), then run by the front's
one runner (``openai.serve``), with the same admission, queueing, wait,
stream, cancellation and charge; only its answers (``_messages``) and its
refusals (``envelopes.anthropic``) are Anthropic's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from hordelite.config import FrontConfig
from hordelite.contract.chat_request import parse_chat_request
from hordelite.contract.horde_header import with_options
from hordelite.contract.limits import MAX_API_KEY_CHARS
from hordelite.contract.messages_request import (
    check_beta_flags,
    parse_count_tokens_request,
    parse_messages_request,
    parse_models_query,
)
from hordelite.contract.progress import streams_progress
from hordelite.errors import RC, HordeError
from hordelite.front._call import Call
from hordelite.front._encoder import from_reply
from hordelite.front._messages import (
    PING,
    MessageShape,
    MessageStream,
    message,
    model_entry,
    models_page,
    token_count,
)
from hordelite.front._relay import relay
from hordelite.front.openai import ChatPlan, OpenAIRoutes, _finished, bearer_key
from hordelite.horde.results import RequestStatus
from hordelite.horde.service import Horde
from hordelite.http import envelopes
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request

# The header that says a client speaks Anthropic's API (every anthropic SDK
# and Claude Code send it): /v1/models answers in Anthropic's shape then.
ANTHROPIC_VERSION_HEADER = "anthropic-version"
BETA_HEADER = "anthropic-beta"
API_KEY_HEADER = "x-api-key"


class MessagesPlan(ChatPlan):
    """``POST /v1/messages``: the chat request its body translates into,
    answered as a Message or Anthropic's event stream."""

    def __init__(self, body: Any, horde: Horde, options: dict[str, Any]) -> None:
        # The header's options go under the body's horde object, as on the
        # chat route, so that its conformance decides what an effort is.
        call = parse_messages_request(with_options(body, options))
        self._take(horde, parse_chat_request(call.chat))
        # Only what the answer needs is kept, not the translated body.
        self.model = call.model
        self.adjustments = call.adjustments
        self.thinking = call.thinking if self.include_reasoning else None
        self._stream: MessageStream | None = None  # a stream's, once it starts

    def _shape(self, call: Call) -> MessageShape:
        return MessageShape(
            call.request_id, self.model, self.prompt_chars, self.thinking, self.adjustments
        )

    def answer(self, call: Call, status: RequestStatus) -> dict[str, Any]:
        return message(self._shape(call), status)

    def events(self, call: Call, config: FrontConfig) -> AsyncIterator[bytes]:
        req = self.req
        assert req is not None  # kept for a stream
        encoder = self._stream = MessageStream(self._shape(call))
        # Reasoning is relayed only when thinking blocks show it.
        shown = self.thinking is not None
        if streams_progress(req):
            return relay(call, encoder, shown, config.pace_progress, config.keepalive_interval)
        return _finished(
            call,
            config.keepalive_interval,
            PING,
            lambda status: from_reply(encoder, status, shown),
        )

    def failure(self, call: Call, exc: HordeError) -> Iterator[bytes]:
        assert self._stream is not None  # a stream's events come first
        return self._stream.failure(exc)


def messages_api_key(request: Request) -> str:
    """The horde key of a Messages call: ``x-api-key`` (Claude Code's), else
    ``Authorization: Bearer`` (the anthropic SDK's); neither is the
    anonymous key. 401 for a blank or overlong ``x-api-key``."""
    key = request.header(API_KEY_HEADER)
    if key is None:
        return bearer_key(request.header("authorization"))
    key = key.strip()
    if not key or len(key) > MAX_API_KEY_CHARS:
        raise HordeError(RC.InvalidAPIKey, "The x-api-key header must hold an API key.")
    return key


class MessagesRoutes:
    """The Messages API's routes, run by the front's ``OpenAIRoutes`` (its
    admission and runner); refusals in Anthropic's envelope."""

    def __init__(self, front: OpenAIRoutes) -> None:
        self.front = front

    async def messages(self, request: Request) -> Answer:
        # Before anything is read or queued: a flag that turns on what is
        # not offered is refused by name (?beta=true, Claude Code's, is not read).
        check_beta_flags(request.joined(BETA_HEADER))
        return await self.front._call(
            request,
            MessagesPlan,
            api_key=lambda: messages_api_key(request),
            envelope=envelopes.anthropic,
        )

    async def count_tokens(self, request: Request) -> Answer:
        """The estimate of the body's input tokens; queues nothing, and the
        key is checked for its form only (nothing of the horde is read)."""
        check_beta_flags(request.joined(BETA_HEADER))
        messages_api_key(request)
        return json_answer(token_count(parse_count_tokens_request(await request.json())))

    async def models(self, request: Request) -> Answer:
        """The models list: Anthropic's shape for a client that sends
        ``anthropic-version``, OpenAI's otherwise."""
        if request.header(ANTHROPIC_VERSION_HEADER) is None:
            return await self.front.models(request)
        try:
            query = parse_models_query(request.query())
            entries = await self._entries()
            page = models_page(
                entries, limit=query.limit, after_id=query.after_id, before_id=query.before_id
            )
        except HordeError as exc:
            return envelopes.anthropic(exc)
        return json_answer(page)

    async def model(self, request: Request) -> Answer:
        """One model, in the shape ``models`` lists it."""
        if request.header(ANTHROPIC_VERSION_HEADER) is None:
            return await self.front.model(request)
        name = request.params["model"]
        for entry in await self._entries():
            if entry["id"] == name:
                return json_answer(entry)
        return envelopes.anthropic(
            HordeError(
                RC.model_not_found,
                f"The model {name!r} does not exist on this front.",
                param="model",
            )
        )

    async def _entries(self) -> list[dict[str, Any]]:
        return [model_entry(entry["id"], entry["chat"]) for entry in await self.front.chat_models()]


async def probe(request: Request) -> Answer:
    """``HEAD /``: Claude Code's first call, answered whether or not the
    dashboard serves the root."""
    return Answer(200, [])
